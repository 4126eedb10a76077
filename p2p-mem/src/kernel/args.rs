//! What a launch passes: a kernel's arguments as a typed value ([`KernelArgs`]) and the launch's
//! shape ([`LaunchConfig`]). The array of parameter pointers the driver takes is built here and
//! in [`Module::launch`](super::Module::launch), nowhere else.

use std::ffi::c_void;
use std::marker::PhantomData;

/// The most parameters a kernel launched through [`KernelArgs`] takes. Ours take one argument
/// block each; tuples of up to this many scalars serve test and probe kernels.
pub const MAX_PARAMS: usize = 4;

/// A kernel's parameters as one Rust value: the argument block of a kernel that takes one
/// `#[repr(C)]` struct by value (what `p2p-abigen` generates for every struct of a kernel
/// interface header, the same text NVRTC compiles in front of the kernel), a single scalar, or
/// a tuple of scalars for a kernel with that many scalar parameters.
///
/// # Safety
/// [`params`](Self::params) must give one pointer per parameter, in the kernel's order, each to
/// a value laid out exactly as that parameter's type (size, alignment, field order), valid for
/// as long as the borrow of `self`. The default, one pointer to `self`, is right for a
/// `#[repr(C)]` struct laid out as the kernel's one by-value parameter, and for nothing else.
/// Pointers *inside* the value (device addresses) are not this trait's concern: the launch
/// that passes them is `unsafe` for them.
///
/// # Example
/// ```
/// use p2p_mem::kernel::KernelArgs;
///
/// /// Laid out as `struct FillArgs { unsigned long long dst; unsigned n; unsigned value; };`.
/// #[repr(C)]
/// #[derive(Clone, Copy)]
/// struct FillArgs {
///     dst: u64,
///     n: u32,
///     value: u32,
/// }
/// // SAFETY: `#[repr(C)]`, field for field the kernel's one by-value parameter.
/// unsafe impl KernelArgs for FillArgs {}
///
/// let args = FillArgs { dst: 0, n: 4, value: 7 };
/// assert_eq!(args.params().len(), 1);
/// assert_eq!((0u64, 60_000u64).params().len(), 2);
/// ```
pub unsafe trait KernelArgs {
    /// One pointer per kernel parameter, in order (see the trait's safety contract).
    fn params(&self) -> Params<'_>
    where
        Self: Sized,
    {
        Params::one(self)
    }
}

/// The parameter pointers of one launch, borrowed from the [`KernelArgs`] value they point
/// into: the `kernelParams` array of `cuLaunchKernel`, at most [`MAX_PARAMS`] long.
pub struct Params<'a> {
    ptrs: [*mut c_void; MAX_PARAMS],
    len: usize,
    _args: PhantomData<&'a ()>,
}

impl<'a> Params<'a> {
    /// No parameters.
    pub const fn none() -> Params<'static> {
        Params {
            ptrs: [std::ptr::null_mut(); MAX_PARAMS],
            len: 0,
            _args: PhantomData,
        }
    }

    /// One parameter: `value` itself (a by-value struct or a scalar).
    pub fn one<T>(value: &'a T) -> Params<'a> {
        let mut p = Params::none();
        p.push(value);
        p
    }

    /// `value` as the next parameter. Past [`MAX_PARAMS`] it is dropped, and the launch refuses
    /// the list (see [`is_whole`](Self::is_whole)) rather than pass a short one.
    pub fn push<T>(&mut self, value: &'a T) {
        if self.len < MAX_PARAMS {
            // The driver only reads through these pointers (it copies the values at launch).
            self.ptrs[self.len] = (value as *const T).cast_mut().cast::<c_void>();
        }
        self.len += 1;
    }

    /// How many parameters.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every pushed parameter fit (at most [`MAX_PARAMS`]).
    pub fn is_whole(&self) -> bool {
        self.len <= MAX_PARAMS
    }

    /// The array the driver takes; valid while `self` (and the borrowed value) is.
    pub(super) fn as_driver_array(&mut self) -> *mut *mut c_void {
        self.ptrs.as_mut_ptr()
    }
}

/// Scalar types a kernel may take directly (C's `unsigned`, `unsigned long long`, `int`,
/// `long long`, `float`, `double`); sealed.
pub trait Scalar: sealed::Sealed + Copy {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! scalars {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Scalar for $t {}
        // SAFETY: one parameter of exactly this scalar type.
        unsafe impl KernelArgs for $t {}
    )*};
}
scalars!(u32, u64, i32, i64, f32, f64);

// SAFETY: no parameters, no pointers.
unsafe impl KernelArgs for () {
    fn params(&self) -> Params<'_> {
        Params::none()
    }
}

macro_rules! tuples {
    ($(($($name:ident . $i:tt),+)),*) => {$(
        // SAFETY: one pointer per element, each to a scalar of that element's type, in order.
        unsafe impl<$($name: Scalar),+> KernelArgs for ($($name,)+) {
            fn params(&self) -> Params<'_> {
                let mut p = Params::none();
                $(p.push(&self.$i);)+
                p
            }
        }
    )*};
}
tuples!((A.0, B.1), (A.0, B.1, C.2), (A.0, B.1, C.2, D.3));

/// The shape of one launch: `grid` blocks of `block` threads (one dimension each, no dynamic
/// shared memory), and whether it may overlap the previous kernel on the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: u32,
    /// Threads in a block.
    pub block: u32,
    /// Programmatic dependent launch on GPUs of compute capability 9.0 and newer: the kernel
    /// may be scheduled while the previous kernel on the stream still runs, hiding the launch
    /// gap. Ignored (a plain launch) on older GPUs. A kernel launched so must run
    /// `griddepcontrol.wait` before it touches memory that earlier work on the stream writes.
    pub overlapped: bool,
}

impl LaunchConfig {
    /// A plain launch of `grid` blocks of `block` threads.
    pub const fn new(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig {
            grid,
            block,
            overlapped: false,
        }
    }

    /// The same launch, overlapped with the previous kernel or not (see
    /// [`overlapped`](Self::overlapped)).
    pub const fn overlapped(self, overlapped: bool) -> LaunchConfig {
        LaunchConfig { overlapped, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    struct Block {
        a: u64,
        b: u32,
    }
    // SAFETY: a test value, never launched.
    unsafe impl KernelArgs for Block {}

    #[test]
    fn each_form_points_at_its_values_in_order() {
        let block = Block { a: 1, b: 2 };
        let p = block.params();
        assert_eq!(p.len(), 1);
        assert_eq!(
            p.ptrs[0].cast_const(),
            (&block as *const Block).cast::<c_void>()
        );
        let t = (5u64, 6i32, 7.0f32);
        let p = t.params();
        assert_eq!(p.len(), 3);
        assert_eq!(
            p.ptrs[1].cast_const(),
            (&t.1 as *const i32).cast::<c_void>()
        );
        // SAFETY: the pointers point into `t`, alive here.
        unsafe {
            assert_eq!(*p.ptrs[0].cast::<u64>(), 5);
            assert_eq!(*p.ptrs[2].cast::<f32>(), 7.0);
        }
        assert!(().params().is_empty());
        assert_eq!(9u32.params().len(), 1);
    }

    #[test]
    fn too_many_parameters_are_not_whole() {
        let v = [0u64; MAX_PARAMS + 1];
        let mut p = Params::none();
        for x in &v {
            p.push(x);
        }
        assert!(!p.is_whole());
        assert_eq!(p.len(), MAX_PARAMS + 1);
        let mut q = Params::none();
        for x in &v[..MAX_PARAMS] {
            q.push(x);
        }
        assert!(q.is_whole());
    }

    #[test]
    fn a_config_is_plain_unless_asked() {
        let c = LaunchConfig::new(4, 512);
        assert!(!c.overlapped);
        assert!(c.overlapped(true).overlapped);
        assert_eq!(c.overlapped(true).grid, 4);
    }
}
