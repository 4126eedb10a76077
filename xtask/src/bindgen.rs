//! `cargo xtask bindgen`: p2p-sys's own bindings to the CUDA driver and NVRTC, generated from
//! pinned headers and committed.
//!
//! bindgen writes the types and the C declarations; this file turns each declaration into an
//! entry of a table resolved from the library at first use (`None` where the library lacks it)
//! and a free function of the same name and signature that calls it, or returns the "missing"
//! result. So p2p needs no cudarc feature (the application keeps cudarc's CUDA version and
//! linking choice), and a driver older than an entry point gives an error, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{run, Result};

/// The driver and NVRTC headers: CUDA 12.4, the oldest release p2p supports. Every entry point
/// in them exists in every driver from 12.4 on (the driver keeps old versioned symbols).
const CUDA_12_WHEELS: [&str; 2] = [
    "nvidia-cuda-runtime-cu12==12.4.127",
    "nvidia-cuda-nvrtc-cu12==12.4.127",
];
/// The headers of the newer entry points p2p uses where the driver has them: the process
/// checkpoint API (CUDA 12.8+) and `cuCtxRecordEvent` (not in 12.4's headers).
const CUDA_13_WHEEL: &str = "nvidia-cuda-runtime==13.0.96";

/// NCCL's headers: 2.18, whose API (unique ids, init by rank with a non-blocking config, abort,
/// asynchronous errors, the collectives, send/recv, groups) every later NCCL keeps.
const NCCL_WHEEL: &str = "nvidia-nccl-cu12==2.18.3";

/// The NCCL entry points a communicator across hosts calls.
const NCCL: &[&str] = &[
    "ncclAllGather",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommDestroy",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommInitRankConfig",
    "ncclCommUserRank",
    "ncclGetErrorString",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupStart",
    "ncclRecv",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclSend",
];

/// The driver entry points p2p calls, by the versioned names `cuda.h` maps them to.
const DRIVER: &[&str] = &[
    "cuCtxDisablePeerAccess",
    "cuCtxEnablePeerAccess",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuDeviceCanAccessPeer",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetP2PAttribute",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDeviceTotalMem_v2",
    "cuDriverGetVersion",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventElapsedTime",
    "cuEventQuery",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuInit",
    "cuIpcCloseMemHandle",
    "cuIpcGetEventHandle",
    "cuIpcGetMemHandle",
    "cuIpcOpenEventHandle",
    "cuIpcOpenMemHandle_v2",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuMemAddressFree",
    "cuMemAddressReserve",
    "cuMemAlloc_v2",
    "cuMemCreate",
    "cuMemExportToShareableHandle",
    "cuMemFreeHost",
    "cuMemFree_v2",
    "cuMemGetAddressRange_v2",
    "cuMemGetAllocationGranularity",
    "cuMemGetInfo_v2",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemImportFromShareableHandle",
    "cuMemMap",
    "cuMemRelease",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemcpyAsync",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyPeer",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuMemsetD8_v2",
    "cuModuleGetFunction",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuPointerGetAttribute",
    "cuStreamBeginCapture_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamWriteValue64_v2",
];

/// Driver types and constants p2p names that no entry point above reaches.
const DRIVER_TYPES: &str = "CUmemFabricHandle.*|CUstream_flags.*|CUevent_flags.*|CUipcMem_flags.*\
|CUpointer_attribute.*|CUdevice_attribute.*|CUmemAccess_flags.*|CUmemLocationType.*\
|CUmemAllocationType.*|CUmemAllocationGranularity_flags.*|CUstreamCaptureMode.*\
|CUdevice_P2PAttribute.*|CUgraphInstantiate_flags.*|CUmemorytype.*|CUstreamWriteValue_flags.*\
|CUmemAllocationCompType.*|CUlaunchAttribute.*|CUmemoryPool|CUmemAllocationHandleType.*";
const DRIVER_VARS: &str = "CU_MEMHOSTALLOC_.*|CU_MEMHOSTREGISTER_.*|CU_IPC_HANDLE_SIZE";

const NVRTC: &[&str] = &[
    "nvrtcCompileProgram",
    "nvrtcCreateProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetCUBIN",
    "nvrtcGetCUBINSize",
    "nvrtcGetErrorString",
    "nvrtcGetProgramLog",
    "nvrtcGetProgramLogSize",
    "nvrtcVersion",
];

/// One generated module.
struct Module {
    /// Where it is written, from the workspace root.
    dest: &'static str,
    /// Its first doc line.
    title: &'static str,
    /// The wheel whose headers it comes from.
    wheel: &'static str,
    /// The header, from the wheel's root.
    header: &'static str,
    /// The entry points (bindgen's allowlist).
    functions: &'static [&'static str],
    /// bindgen arguments beyond the allowlist.
    extra: &'static [&'static str],
    /// The `p2p_sys::Library` the entry points come from.
    library: &'static str,
    /// The result type every entry point returns but the string getters, and the value a
    /// missing entry point returns.
    result: &'static str,
    missing: &'static str,
    /// Lines placed before bindgen's output.
    prelude: &'static str,
    /// Stand-ins for headers the header includes but whose parts the bindings do not use
    /// (file name, text), in a folder searched first; and macros defined for the compile.
    stand_ins: &'static [(&'static str, &'static str)],
    defines: &'static [&'static str],
}

const MODULES: [Module; 5] = [
    Module {
        dest: "p2p-sys/src/cuda.rs",
        title: "The CUDA driver API (`libcuda`): the types and entry points p2p uses",
        wheel: CUDA_12_WHEELS[0],
        header: "nvidia/cuda_runtime/include/cuda.h",
        functions: DRIVER,
        extra: &[
            "--allowlist-type",
            DRIVER_TYPES,
            "--allowlist-var",
            DRIVER_VARS,
            "--newtype-enum",
            "cudaError_enum",
            // Bit flags, combined with `|` on `.0`.
            "--newtype-enum",
            "CUmemAllocationHandleType_enum",
        ],
        library: "Cuda",
        result: "CUresult",
        missing: "CUresult::CUDA_ERROR_NOT_FOUND",
        prelude: "",
        stand_ins: &[],
        defines: &[],
    },
    Module {
        dest: "p2p-sys/src/nvrtc.rs",
        title: "NVRTC, the run-time compiler (`libnvrtc`): the entry points p2p uses",
        wheel: CUDA_12_WHEELS[1],
        header: "nvidia/cuda_nvrtc/include/nvrtc.h",
        functions: NVRTC,
        extra: &["--newtype-enum", "nvrtcResult"],
        library: "Nvrtc",
        result: "nvrtcResult",
        missing: "nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR",
        prelude: "",
        stand_ins: &[],
        defines: &[],
    },
    Module {
        dest: "p2p-sys/src/checkpoint.rs",
        title: "The CUDA process checkpoint API (`cuCheckpointProcess*`, drivers from CUDA 12.8)",
        wheel: CUDA_13_WHEEL,
        header: "nvidia/cu13/include/cuda.h",
        functions: &[
            "cuCheckpointProcessCheckpoint",
            "cuCheckpointProcessGetRestoreThreadId",
            "cuCheckpointProcessGetState",
            "cuCheckpointProcessLock",
            "cuCheckpointProcessRestore",
            "cuCheckpointProcessUnlock",
        ],
        // Its own argument types; the rest (CUresult) are the driver module's.
        extra: &[
            "--allowlist-type",
            "CUcheckpoint.*|CUprocessState.*",
            "--blocklist-type",
            "CUresult|cudaError_enum",
            "--newtype-enum",
            "CUprocessState_enum",
        ],
        library: "Cuda",
        result: "CUresult",
        missing: "CUresult::CUDA_ERROR_NOT_FOUND",
        prelude: "#[allow(unused_imports)]\nuse crate::cuda::{CUresult, cudaError_enum};\n",
        stand_ins: &[],
        defines: &[],
    },
    Module {
        dest: "p2p-sys/src/ctx_event.rs",
        title: "Recording all of a context's queued work in one event (`cuCtxRecordEvent`, drivers newer than CUDA 12.4)",
        wheel: CUDA_13_WHEEL,
        header: "nvidia/cu13/include/cuda.h",
        functions: &["cuCtxRecordEvent"],
        // Every argument type is the driver module's.
        extra: &[
            "--blocklist-type",
            "CUresult|cudaError_enum|CUcontext|CUctx_st|CUevent|CUevent_st",
        ],
        library: "Cuda",
        result: "CUresult",
        missing: "CUresult::CUDA_ERROR_NOT_FOUND",
        prelude: "#[allow(unused_imports)]\nuse crate::cuda::{CUcontext, CUevent, CUresult, cudaError_enum};\n",
        stand_ins: &[],
        defines: &[],
    },
    Module {
        dest: "p2p-sys/src/nccl_rt.rs",
        title: "NCCL (`libnccl.so.2`), loaded at run time: the entry points a communicator across hosts uses",
        wheel: NCCL_WHEEL,
        header: "nvidia/nccl/include/nccl.h",
        functions: NCCL,
        // Its own types; a CUDA stream is the driver module's (the runtime's `cudaStream_t` is the
        // same pointer).
        extra: &[
            "--allowlist-type",
            "ncclComm.*|ncclUniqueId|ncclResult_t|ncclDataType_t|ncclRedOp_t|ncclConfig.*",
            "--allowlist-var",
            "NCCL_UNIQUE_ID_BYTES|NCCL_SPLIT_NOCOLOR",
            "--blocklist-type",
            "cudaStream_t|CUstream_st",
            "--newtype-enum",
            "ncclResult_t",
            "--newtype-enum",
            "ncclDataType_t",
            "--newtype-enum",
            "ncclRedOp_t",
        ],
        library: "Nccl",
        result: "ncclResult_t",
        missing: "ncclResult_t::ncclSystemError",
        prelude: "/// The CUDA runtime's stream: the driver's `CUstream`.\npub type cudaStream_t = crate::cuda::CUstream;\n",
        // nccl.h includes the CUDA runtime's headers (which need nvcc's own) for `cudaStream_t`
        // and the bf16 type's presence only.
        stand_ins: &[
            ("cuda_runtime.h", "#include <stddef.h>\ntypedef struct CUstream_st *cudaStream_t;\n"),
            ("cuda_fp16.h", ""),
            ("cuda_bf16.h", ""),
        ],
        defines: &["__CUDA_BF16_TYPES_EXIST__"],
    },
];

/// Regenerates every module.
pub fn bindgen(root: &Path) -> Result<()> {
    let work = root.join("target/bindgen");
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    for module in &MODULES {
        let dir = unpacked(&work, module.wheel)?;
        let header = dir.join(module.header);
        let include = header.parent().ok_or("a header has no directory")?;
        let mut cmd = Command::new("bindgen");
        cmd.arg(&header);
        for f in module.functions {
            cmd.args(["--allowlist-function", f]);
        }
        cmd.args(module.extra)
            .args(["--default-enum-style", "rust", "--no-layout-tests"])
            .args(["--no-doc-comments", "--use-core", "--merge-extern-blocks"])
            .args(["--rust-target", "1.85", "--rust-edition", "2021"])
            .arg("--")
            .arg(format!("-I{}", include.display()));
        if !module.stand_ins.is_empty() {
            let dir = work.join(format!("stand-ins-{}", module.library));
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            for (name, text) in module.stand_ins {
                let file = dir.join(name);
                std::fs::write(&file, text)
                    .map_err(|e| format!("writing {}: {e}", file.display()))?;
            }
            cmd.arg(format!("-I{}", dir.display()));
        }
        for d in module.defines {
            cmd.arg(format!("-D{d}"));
        }
        eprintln!("xtask: running {cmd:?}");
        let output = cmd.output().map_err(|e| {
            format!("could not start bindgen (cargo install bindgen-cli; apt-get install libclang-dev): {e}")
        })?;
        if !output.status.success() {
            return Err(format!(
                "bindgen failed on {}:\n{}",
                module.header,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        let text = module_text(module, &String::from_utf8_lossy(&output.stdout))?;
        let dest = root.join(module.dest);
        std::fs::write(&dest, text).map_err(|e| format!("writing {}: {e}", dest.display()))?;
        run(Command::new("rustfmt").arg("--edition=2021").arg(&dest))?;
        eprintln!("xtask: wrote {}", dest.display());
    }
    Ok(())
}

/// The wheel's files under `work/<wheel>/`, downloaded and unpacked once.
fn unpacked(work: &Path, wheel: &str) -> Result<PathBuf> {
    let dir = work.join(wheel.replace("==", "-"));
    if dir.join("nvidia").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    run(Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps"])
        .args([
            "--only-binary=:all:",
            "--platform",
            "manylinux2014_x86_64",
            "-d",
        ])
        .arg(&dir)
        .arg(wheel))?;
    let file = std::fs::read_dir(&dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip downloaded no wheel for {wheel}"))?;
    run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&file)
        .arg(&dir))?;
    Ok(dir)
}

/// One C declaration: `pub fn name(params) -> ret;`.
struct Decl {
    name: String,
    /// `(name, type)` of each parameter.
    params: Vec<(String, String)>,
    ret: String,
}

impl Decl {
    fn fn_type(&self) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .map(|(n, t)| format!("{n}: {t}"))
            .collect();
        format!(
            "unsafe extern \"C\" fn({}) -> {}",
            params.join(", "),
            self.ret
        )
    }
}

/// Splits bindgen's output into everything but the extern block, and the declarations in it.
fn split_externs(generated: &str) -> Result<(String, Vec<Decl>)> {
    let mut rest = String::new();
    let mut decls = Vec::new();
    let mut text = generated;
    while let Some(start) = text.find("extern \"C\" {") {
        // `unsafe extern "C" {` (newer bindgen) or `extern "C" {`.
        let head = text[..start].trim_end_matches("unsafe ");
        rest.push_str(head);
        let body_start = start + "extern \"C\" {".len();
        let end = text[body_start..]
            .find("\n}")
            .ok_or("an extern block does not end")?
            + body_start;
        for item in text[body_start..end].split(';') {
            let item = item.split_whitespace().collect::<Vec<_>>().join(" ");
            if item.is_empty() {
                continue;
            }
            decls.push(parse_decl(&item)?);
        }
        text = &text[end + 2..];
    }
    rest.push_str(text);
    Ok((rest, decls))
}

fn parse_decl(item: &str) -> Result<Decl> {
    let item = item
        .strip_prefix("pub fn ")
        .ok_or_else(|| format!("not a function declaration: {item}"))?;
    let open = item.find('(').ok_or("no parameter list")?;
    let close = item.rfind(')').ok_or("no parameter list end")?;
    let name = item[..open].trim().to_string();
    let params = item[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once(':')
                .map(|(n, t)| (n.trim().to_string(), t.trim().to_string()))
                .ok_or_else(|| format!("parameter without a type in {name}: {p}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let ret = item[close + 1..]
        .trim()
        .strip_prefix("->")
        .map(|r| r.trim().to_string())
        .ok_or_else(|| format!("{name} returns nothing"))?;
    Ok(Decl { name, params, ret })
}

/// The `(name, value)` of each constant of a bindgen newtype enum `ty`.
fn newtype_consts(generated: &str, ty: &str) -> Vec<(String, String)> {
    let flat = generated.split_whitespace().collect::<Vec<_>>().join(" ");
    let marker = format!(": {ty} = {ty}(");
    flat.split("pub const ")
        .skip(1)
        .filter_map(|c| {
            let (name, value) = c.split_once(&marker)?;
            let value = value.split_once(')')?.0;
            Some((name.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

fn module_text(m: &Module, generated: &str) -> Result<String> {
    let (rest, decls) = split_externs(generated)?;
    let names: Vec<&str> = decls.iter().map(|d| d.name.as_str()).collect();
    for f in m.functions {
        if !names.contains(f) {
            return Err(format!("{} declares no {f}", m.header));
        }
    }
    let mut out = format!(
        "//! {title}: GENERATED by `cargo xtask bindgen` from `{header}` of PyPI `{wheel}`.\n\
         //! An entry point the library lacks returns `{missing}` (see [`has`] and `crate::table`).\n\
         #![allow(nonstandard_style, missing_docs, dead_code, unsafe_op_in_unsafe_fn)]\n\
         #![allow(clippy::all, clippy::undocumented_unsafe_blocks)]\n\n\
         {prelude}\n{rest}\n",
        title = m.title,
        header = m.header,
        wheel = m.wheel,
        missing = m.missing,
        prelude = m.prelude,
    );
    for d in &decls {
        out.push_str(&format!("type {}_fn = {};\n", d.name, d.fn_type()));
    }
    // The table, its loader, ENTRY_POINTS and has(): one macro for every module (p2p-sys's
    // table.rs), so the generated modules repeat nothing but their entries.
    out.push_str(&format!(
        "\ncrate::table::entry_table! {{\nlibrary: {},\nentries: {{\n",
        m.library
    ));
    for d in &decls {
        out.push_str(&format!("    {0}: {0}_fn,\n", d.name));
    }
    out.push_str("}\n}\n\n");
    // One wrapper per entry point, all through one macro (p2p-sys's table.rs).
    let mut fns = String::from("crate::table::entry_fns! {\n");
    for d in &decls {
        let missing = if d.ret == m.result {
            m.missing.to_string()
        } else if d.ret.starts_with("*const") {
            "::core::ptr::null()".to_string()
        } else {
            return Err(format!(
                "{} returns {}: no value stands for its absence",
                d.name, d.ret
            ));
        };
        let params: Vec<String> = d.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        fns.push_str(&format!(
            "    fn {name}({params}) -> {ret} = {missing}, \"{missing}\";\n",
            name = d.name,
            params = params.join(", "),
            ret = d.ret,
        ));
    }
    fns.push_str("}\n\n");
    out.push_str(&fns);
    // The symbolic names of the result codes, known without the library.
    let result_ty = if m.result == "CUresult" {
        "cudaError_enum"
    } else {
        m.result
    };
    let consts = newtype_consts(&rest, result_ty);
    if !consts.is_empty() {
        out.push_str(&format!(
            "impl {result_ty} {{\n\
             /// The code's symbolic name in the headers these bindings come from (`None` for a code\n\
             /// added since).\n\
             pub fn name(self) -> Option<&'static str> {{\nmatch self.0 {{\n"
        ));
        let mut seen = std::collections::HashSet::new();
        for (name, value) in consts {
            if seen.insert(value.clone()) {
                out.push_str(&format!("    {value} => Some(\"{name}\"),\n"));
            }
        }
        out.push_str("    _ => None,\n}\n}\n}\n");
    }
    Ok(out)
}
