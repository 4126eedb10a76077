//! GPU tests of the FFI layer. Ignored in CI (no GPU); the bundle's `run.sh` runs them.

use p2p_sys::{cu, cuda, probe, Library};

#[test]
#[ignore = "needs a GPU"]
fn gpu1_driver_loads_reports_its_version_and_has_every_entry_point() {
    let lib = probe::require(Library::Cuda).expect("libcuda must load on a GPU machine");
    p2p_sys::init_driver().expect("cuInit");
    let version = p2p_sys::driver_version().expect("cuDriverGetVersion");
    eprintln!("{lib}: CUDA {}.{}", version / 1000, version % 1000 / 10);
    // The bindings come from CUDA 12.4's headers: any driver from 12.4 has every entry point.
    assert!(
        version >= p2p_sys::MIN_DRIVER_VERSION,
        "driver supports CUDA {version}, the bindings need {}",
        p2p_sys::MIN_DRIVER_VERSION
    );
    let missing: Vec<&str> = cuda::ENTRY_POINTS
        .iter()
        .copied()
        .filter(|e| !cuda::has(e))
        .collect();
    assert!(missing.is_empty(), "libcuda lacks {missing:?}");
    for l in Library::ALL {
        eprintln!("{l}: {:?}", probe::require(l));
    }
    let mut count = 0;
    // SAFETY: the driver is initialised; `count` is an out-pointer.
    unsafe { cu!(cuDeviceGetCount(&mut count)) }.expect("cuDeviceGetCount");
    assert!(count >= 1);
    // A real failing call: an invalid ordinal gives a named error with the driver's message.
    let mut dev = 0;
    // SAFETY: as above; the ordinal is invalid on purpose.
    let err = unsafe { cu!(cuDeviceGet(&mut dev, 9999)) }.expect_err("ordinal 9999");
    assert!(
        err.is_driver(cuda::CUresult::CUDA_ERROR_INVALID_DEVICE),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE (invalid device ordinal)"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_runtime_and_nvrtc_load_and_name_their_errors() {
    #[cfg(feature = "tools")]
    runtime_names_its_errors();
    probe::require(Library::Nvrtc).expect("libnvrtc on the GPU machine");
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is loaded; both are out-pointers.
    p2p_sys::check_nvrtc("nvrtcVersion", unsafe {
        p2p_sys::nvrtc::nvrtcVersion(&mut major, &mut minor)
    })
    .expect("version");
    eprintln!("NVRTC {major}.{minor}");
    assert!(major >= 12);
    let missing: Vec<&str> = p2p_sys::nvrtc::ENTRY_POINTS
        .iter()
        .copied()
        .filter(|e| !p2p_sys::nvrtc::has(e))
        .collect();
    assert!(missing.is_empty(), "libnvrtc lacks {missing:?}");
}

#[cfg(feature = "tools")]
fn runtime_names_its_errors() {
    probe::require(Library::Cudart).expect("libcudart on the GPU machine");
    let mut n = 0;
    // SAFETY: libcudart is loaded; `n` is an out-pointer.
    p2p_sys::check_cudart("cudaGetDeviceCount", unsafe {
        p2p_sys::cudart::cudaGetDeviceCount(&mut n)
    })
    .expect("count");
    assert!(n >= 1);
    // SAFETY: as above; the device is invalid on purpose.
    let err = p2p_sys::check_cudart("cudaSetDevice", unsafe {
        p2p_sys::cudart::cudaSetDevice(9999)
    })
    .expect_err("bad device");
    assert!(
        err.to_string()
            .starts_with("cudaSetDevice failed: cudaErrorInvalidDevice (invalid device ordinal)"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_generated_checkpoint_bindings_resolve_and_answer() {
    p2p_sys::init_driver().expect("cuInit");
    use p2p_sys::checkpoint::{self, CUprocessState};
    let missing: Vec<&str> = checkpoint::ENTRY_POINTS
        .iter()
        .copied()
        .filter(|e| !checkpoint::has(e))
        .collect();
    assert!(
        missing.is_empty(),
        "libcuda (13.0 on the GPU machines) lacks {missing:?}"
    );
    let mut state = CUprocessState::CU_PROCESS_STATE_FAILED;
    // Give this process a context first, so the driver tracks it.
    let mut dev = 0;
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the driver is initialised; out-pointers are valid; the context is released below.
    unsafe { cu!(cuDeviceGet(&mut dev, 0)) }.expect("device");
    // SAFETY: as above.
    unsafe { cu!(cuDevicePrimaryCtxRetain(&mut ctx, dev)) }.expect("context");
    // SAFETY: `state` is a valid out-pointer; the pid is this process's.
    let r =
        unsafe { checkpoint::cuCheckpointProcessGetState(std::process::id() as i32, &mut state) };
    p2p_sys::check_cu("cuCheckpointProcessGetState", r).expect("state of this process");
    assert_eq!(state, CUprocessState::CU_PROCESS_STATE_RUNNING);
    // SAFETY: releases the reference retained above.
    unsafe { cu!(cuDevicePrimaryCtxRelease_v2(dev)) }.expect("release");
}
