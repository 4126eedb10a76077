//! A loaded module and its kernels: loading a cubin into a device's context and launching.

use std::ffi::CString;
use std::marker::PhantomData;
use std::sync::Arc;

use p2p_sys::{cu, cuda};

use crate::device::{Device, Stream};
use crate::error::{Error, Result};

use super::*;

/// A kernel in a loaded [`Module`], typed by its parameters `A` (see [`KernelArgs`]): a launch
/// takes an `&A`, so the kernel's parameter type is named once, where the kernel is looked up.
/// It keeps its module loaded, so its handle never dangles: the module is unloaded when the
/// [`Module`] and all its `Function`s are gone. It launches only through that [`Module`].
pub struct Function<A> {
    raw: cuda::CUfunction,
    module: Arc<Loaded>,
    _args: PhantomData<fn(&A)>,
}

impl<A> Clone for Function<A> {
    fn clone(&self) -> Self {
        Function {
            raw: self.raw,
            module: self.module.clone(),
            _args: PhantomData,
        }
    }
}

impl<A> std::fmt::Debug for Function<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("raw", &self.raw)
            .field("device", &self.module.device.ordinal())
            .field("args", &std::any::type_name::<A>())
            .finish()
    }
}

// SAFETY: a CUfunction is an immutable handle usable from any thread; its module (held) is too;
// `A` is only a marker.
unsafe impl<A> Send for Function<A> {}
// SAFETY: as above.
unsafe impl<A> Sync for Function<A> {}

impl<A> Function<A> {
    /// How many blocks of `threads` threads can be resident on one SM at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`, no dynamic shared memory).
    pub fn max_blocks_per_sm(&self, threads: u32) -> Result<i32> {
        let mut n = 0;
        // SAFETY: the function handle is live while its module is, which this holds; `n` is an
        // out-pointer.
        unsafe {
            p2p_sys::cu!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                self.raw,
                threads as i32,
                0
            ))
        }
        .map_err(|e| on(&self.module.device, e))?;
        Ok(n)
    }
}

/// A cubin loaded into one device's context; unloaded once it and every [`Function`] taken
/// from it are dropped.
pub struct Module {
    inner: Arc<Loaded>,
}

/// A loaded module's handle, shared by the [`Module`] and its [`Function`]s; unloads on `Drop`.
pub(super) struct Loaded {
    pub(super) device: Device,
    pub(super) raw: cuda::CUmodule,
}

// SAFETY: a CUmodule may be used from any thread; each use binds the device first.
unsafe impl Send for Loaded {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Loaded {}

impl Module {
    /// Compiles `source` for `device`'s architecture (cached: [`compile_cached`]) and loads it.
    pub fn build(device: &Device, source: &Source) -> Result<Module> {
        let mut modules = Self::build_all(device, std::slice::from_ref(source))?;
        modules
            .pop()
            .ok_or_else(|| compile_error(source, &arch_for(device), "no module"))
    }

    /// Compiles `sources` for `device`'s architecture (cached: [`compile_cached_all`]; the ones
    /// missing from the cache in parallel) and loads one module each, in their order.
    ///
    /// A cubin the driver refuses as an invalid image (a damaged cache file that still looks
    /// whole) is compiled again, replaced in the cache and loaded once more, with a warning; a
    /// fresh cubin's refusal is an error.
    pub fn build_all(device: &Device, sources: &[Source]) -> Result<Vec<Module>> {
        let arch = arch_for(device);
        let cubins = compile_cached_all(sources, &arch)?;
        let mut modules = Vec::with_capacity(sources.len());
        for (source, cubin) in sources.iter().zip(&cubins) {
            let module = match Self::load(device, cubin) {
                // A damaged image (a fresh compile's would not be): compiled again, past the
                // memo and the disk, which the new cubin then replaces in both.
                Err(Error::Cuda { source: e, .. })
                    if e.is_driver(cuda::cudaError_enum::CUDA_ERROR_INVALID_IMAGE) =>
                {
                    tracing::warn!(device = device.ordinal(), kernel = %source.label(), %arch, "the driver refused a cached cubin ({e}): compiling it again and replacing it in the cache");
                    let fresh = cubins_warned(
                        std::slice::from_ref(source),
                        &arch,
                        Reuse::Nothing,
                        Some(COMPILE_LIMIT),
                    )?;
                    let cubin = only(fresh, source, &arch)?;
                    Self::load(device, &cubin)?
                }
                loaded => loaded?,
            };
            modules.push(module);
        }
        Ok(modules)
    }

    /// Loads a cubin (or NUL-terminated PTX) into `device`'s context. Anything else is refused
    /// before the driver sees it (it takes no length, so it could read past the slice); see
    /// [`check_image`] for what is checked.
    pub fn load(device: &Device, cubin: &[u8]) -> Result<Module> {
        check_image(cubin)?;
        device.bind_to_thread()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a context is current; `cubin` is a whole ELF image or ends with a NUL inside
        // the slice (check_image), and outlives the call.
        unsafe { cu!(cuModuleLoadData(&mut raw, cubin.as_ptr().cast())) }
            .map_err(|e| on(device, e))?;
        Ok(Module {
            inner: Arc::new(Loaded {
                device: device.clone(),
                raw,
            }),
        })
    }

    /// Looks up a kernel by name, for [`launch`](Self::launch), as taking the parameters `A`
    /// (what a launch will pass; nothing checks it against the kernel here).
    pub fn function<A: KernelArgs>(&self, name: &str) -> Result<Function<A>> {
        let Loaded { device, raw } = &*self.inner;
        device.bind_to_thread()?;
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?}")))?;
        let mut f = std::ptr::null_mut();
        // SAFETY: the module is loaded; `cname` is NUL-terminated.
        unsafe { cu!(cuModuleGetFunction(&mut f, *raw, cname.as_ptr())) }
            .map_err(|e| on(device, e))?;
        Ok(Function {
            raw: f,
            module: self.inner.clone(),
            _args: PhantomData,
        })
    }

    /// Queues `function` (one of this module's) on `stream` (which must be on this module's
    /// device) with `args`, shaped by `config`. An overlapped launch (programmatic dependent
    /// launch) on a GPU older than compute capability 9.0 is a plain one.
    ///
    /// # Safety
    /// - `A` must be the kernel's parameter list (see [`KernelArgs`]): the type `function` was
    ///   looked up with must be the one the kernel was compiled with (for our kernels, the
    ///   struct `p2p-abigen` generates from the header compiled in front of them).
    /// - Every device pointer in `args` must be valid for what the kernel accesses, and stay
    ///   allocated until the stream has run it.
    /// - With `config.overlapped`, the kernel must execute `griddepcontrol.wait` before it
    ///   touches memory that earlier work on the stream writes.
    ///
    /// # Example
    /// ```no_run
    /// # fn main() -> p2p_mem::Result<()> {
    /// use p2p_mem::kernel::{LaunchConfig, Module, Source};
    /// use p2p_mem::{Device, DeviceBuffer, DeviceMemory, Stream};
    ///
    /// const SEVEN: Source = Source {
    ///     name: "seven.cu",
    ///     code: "extern \"C\" __global__ void seven(unsigned* out) { *out = 7; }",
    ///     defines: &[],
    ///     shipped: &[],
    /// };
    /// let device = Device::new(0)?;
    /// let stream = Stream::new(&device)?;
    /// let module = Module::build(&device, &SEVEN)?;
    /// let seven = module.function::<u64>("seven")?;
    /// let out = DeviceBuffer::<u32>::zeroed(&device, 1)?;
    /// // SAFETY: `seven` takes one pointer (a u64 device address) to one u32, which `out` holds
    /// // until the stream has run the kernel (synchronised below).
    /// unsafe { module.launch(&seven, LaunchConfig::new(1, 1), &out.device_ptr(), &stream)? };
    /// stream.synchronize()?;
    /// # Ok(())
    /// # }
    /// ```
    pub unsafe fn launch<A: KernelArgs>(
        &self,
        function: &Function<A>,
        config: LaunchConfig,
        args: &A,
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(function, stream)?;
        let overlapped = config.overlapped && self.inner.device.compute_capability().0 >= 9;
        // SAFETY: the caller guarantees `args` and the kernel's wait; the function belongs to
        // this loaded module and the stream to its device (checked above).
        unsafe {
            self.raw_launch(
                function.raw,
                config,
                overlapped,
                args.params(),
                stream.cu_stream(),
            )
        }
    }

    /// `cuLaunchKernel` (or `cuLaunchKernelEx` with programmatic stream serialization when
    /// `overlapped`) of one of this module's functions on `stream` (null: the legacy default
    /// stream), with this module's device current.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch); `f` must belong to this module.
    unsafe fn raw_launch(
        &self,
        f: cuda::CUfunction,
        config: LaunchConfig,
        overlapped: bool,
        mut params: Params<'_>,
        stream: cuda::CUstream,
    ) -> Result<()> {
        if !params.is_whole() {
            return Err(Error::InvalidArgument(format!(
                "a kernel launched with {} parameters; at most {MAX_PARAMS} pass through KernelArgs",
                params.len()
            )));
        }
        self.inner.device.bind_to_thread()?;
        let LaunchConfig { grid, block, .. } = config;
        if !overlapped {
            // SAFETY: the caller guarantees `params` and `f`; dimensions are plain numbers;
            // `params` (one pointer per parameter) outlives the call.
            return unsafe {
                cu!(cuLaunchKernel(
                    f,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream,
                    params.as_driver_array(),
                    std::ptr::null_mut()
                ))
            }
            .map_err(|e| on(&self.inner.device, e));
        }
        // SAFETY: an all-zero attribute is a valid "no attribute"; we set the id and value.
        let mut attr: cuda::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = cuda::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let launch = cuda::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `launch`, `attr` and `params` outlive the call; the caller guarantees
        // `params`, `f` and the kernel's wait.
        unsafe {
            cu!(cuLaunchKernelEx(
                &launch,
                f,
                params.as_driver_array(),
                std::ptr::null_mut()
            ))
        }
        .map_err(|e| on(&self.inner.device, e))
    }

    fn check_stream<A>(&self, function: &Function<A>, stream: &Stream) -> Result<()> {
        if !Arc::ptr_eq(&function.module, &self.inner) {
            return Err(Error::InvalidArgument(
                "a kernel launched through a module it does not belong to".into(),
            ));
        }
        if stream.device() != &self.inner.device {
            return Err(Error::InvalidArgument(format!(
                "a kernel of GPU {} launched on a stream of GPU {}",
                self.inner.device.ordinal(),
                stream.device().ordinal()
            )));
        }
        Ok(())
    }

    /// Launches the kernel `name`, taking the parameters `A`, on the legacy default stream as
    /// `config` shapes it (plain, never overlapped), and waits for it.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch): `A` must be the kernel's parameter list and every
    /// device pointer in `args` valid for what the kernel accesses.
    pub unsafe fn launch_sync<A: KernelArgs>(
        &self,
        name: &str,
        config: LaunchConfig,
        args: &A,
    ) -> Result<()> {
        let f = self.function::<A>(name)?.raw;
        // SAFETY: the caller guarantees `args`; `f` was just looked up in this module.
        unsafe { self.raw_launch(f, config, false, args.params(), std::ptr::null_mut()) }?;
        self.inner.device.synchronize_default_stream()
    }
}

pub(super) fn on(device: &Device, source: p2p_sys::Error) -> Error {
    Error::Cuda {
        device: device.ordinal(),
        source,
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: loaded by cuModuleLoadData and unloaded once.
        let unload = || unsafe { cu!(cuModuleUnload(self.raw)) };
        self.device.release("unloading a module", unload);
    }
}
