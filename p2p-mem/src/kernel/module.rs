//! A loaded module and its kernels: loading a cubin into a device's context and launching.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use p2p_sys::{cu, cuda};

use crate::device::{Device, Stream};
use crate::error::{Error, Result};

use super::*;

/// A kernel in a loaded [`Module`]. It keeps its module loaded, so its handle never dangles:
/// the module is unloaded when the [`Module`] and all its `Function`s are gone. It launches
/// only through that [`Module`].
#[derive(Clone)]
pub struct Function {
    raw: cuda::CUfunction,
    module: Arc<Loaded>,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Function")
            .field("raw", &self.raw)
            .field("device", &self.module.device.ordinal())
            .finish()
    }
}

// SAFETY: a CUfunction is an immutable handle usable from any thread; its module (held) is too.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
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

    /// Looks up a kernel by name, for [`launch`](Self::launch).
    pub fn function(&self, name: &str) -> Result<Function> {
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
        })
    }

    /// Queues `function` (one of this module's) on `stream` (which must be on this module's
    /// device).
    ///
    /// # Safety
    /// As for [`launch_sync`](Self::launch_sync); in addition every buffer the kernel touches
    /// must stay allocated until the stream has run it.
    pub unsafe fn launch(
        &self,
        function: &Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        stream: &Stream,
    ) -> Result<()> {
        self.check_stream(function, stream)?;
        // SAFETY: the caller guarantees `params`; the function belongs to this loaded module.
        unsafe { self.raw_launch(function.raw, grid, block, params, stream.cu_stream()) }
    }

    /// `cuLaunchKernel` of one of this module's functions on `stream` (null: the legacy default
    /// stream), with this module's device current.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch); `f` must belong to this module.
    unsafe fn raw_launch(
        &self,
        f: cuda::CUfunction,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        stream: cuda::CUstream,
    ) -> Result<()> {
        self.inner.device.bind_to_thread()?;
        // SAFETY: the caller guarantees `params` and `f`; dimensions are plain numbers.
        unsafe {
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
                params.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
        .map_err(|e| on(&self.inner.device, e))
    }

    /// As [`launch`](Self::launch), with programmatic dependent launch on GPUs of compute
    /// capability 9.0 and newer: the kernel may be scheduled while the previous kernel on the
    /// stream is still running, hiding the launch gap between the two. Elsewhere a plain launch.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch); in addition the kernel must execute
    /// `griddepcontrol.wait` before it touches memory that earlier work on the stream writes
    /// (that instruction waits for the previous kernel to finish and its writes to land).
    pub unsafe fn launch_overlapped(
        &self,
        function: &Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
        stream: &Stream,
    ) -> Result<()> {
        if self.inner.device.compute_capability().0 < 9 {
            // SAFETY: the caller's guarantees are those of `launch`.
            return unsafe { self.launch(function, grid, block, params, stream) };
        }
        self.check_stream(function, stream)?;
        self.inner.device.bind_to_thread()?;
        // SAFETY: an all-zero attribute is a valid "no attribute"; we set the id and value.
        let mut attr: cuda::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = cuda::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = cuda::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `config` and `attr` outlive the call; the caller guarantees `params` and the
        // kernel's wait; the function belongs to this loaded module.
        unsafe {
            cu!(cuLaunchKernelEx(
                &config,
                function.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut()
            ))
        }
        .map_err(|e| on(&self.inner.device, e))
    }

    fn check_stream(&self, function: &Function, stream: &Stream) -> Result<()> {
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

    /// Launches `function` on the legacy default stream and waits for it.
    ///
    /// # Safety
    /// `params` must match the kernel's parameters in number, order and type, and every device
    /// pointer among them must be valid for what the kernel accesses.
    pub unsafe fn launch_sync(
        &self,
        function: &str,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let f = self.function(function)?.raw;
        // SAFETY: the caller guarantees `params`; `f` was just looked up in this module.
        unsafe { self.raw_launch(f, grid, block, params, std::ptr::null_mut()) }?;
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
        let _ = self.device.bind_to_thread();
        // SAFETY: loaded by cuModuleLoadData and unloaded once.
        if let Err(e) = unsafe { cu!(cuModuleUnload(self.raw)) } {
            tracing::error!(device = self.device.ordinal(), "unloading a module: {e}");
        }
    }
}
