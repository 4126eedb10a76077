//! `cargo xtask bindgen`: p2p-sys's own bindings to the CUDA driver, NVRTC and NCCL, generated
//! from pinned headers and committed.
//!
//! bindgen writes the types and the C declarations; this file rewrites its output so that each
//! thing is written once:
//!
//! - the declarations become one call of p2p-sys's `table::entry_points!`, a line per entry
//!   point with its C signature (`fn name(args) -> ret;`, or `fn name(args) -> ret = missing;`
//!   where it returns its own "missing" value, not the module's). The macro makes of that one
//!   line the table entry resolved from the library at first use (`None` where the library
//!   lacks it), `ENTRY_POINTS`, `has` and the free function of the same name and signature that
//!   calls the entry or returns the "missing" result;
//! - the opaque handles, structs, Rust enums and newtype enums become one call each of
//!   p2p-sys's `ctypes::handles!`, `ctypes::structs!`, `ctypes::enums!` and
//!   `ctypes::newtype_enums!`, which write the attributes and derives bindgen repeats on every
//!   type, and keep a type's typedefs and constants with it; the result type's symbolic names
//!   (`name()`) come from its one list of constants;
//! - C's integer types are `ffi::c_int` (`use core::ffi;`), and a module takes the types another
//!   module already has from it (bindgen's blocklist, then `use` or `pub use`).
//!
//! So p2p needs no cudarc feature (the application keeps cudarc's CUDA version and linking
//! choice), and a driver older than an entry point gives an error, never a panic.

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
        // Its own argument types; the rest (CUresult, and the UUID and 64-bit integer its
        // structs hold) are the driver module's, re-exported under the same names.
        extra: &[
            "--allowlist-type",
            "CUcheckpoint.*|CUprocessState.*",
            "--blocklist-type",
            "CUresult|cudaError_enum|CUuuid|CUuuid_st|cuuint64_t",
            // bindgen derives nothing from a blocklisted field type; the driver's derive these.
            "--with-derive-custom-struct",
            "CUcheckpoint.*=Debug,Copy,Clone",
            "--newtype-enum",
            "CUprocessState_enum",
        ],
        library: "Cuda",
        result: "CUresult",
        missing: "CUresult::CUDA_ERROR_NOT_FOUND",
        prelude: "use crate::cuda::CUresult;\npub use crate::cuda::{CUuuid, CUuuid_st, cuuint64_t};\n",
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
        prelude: "use crate::cuda::{CUcontext, CUevent, CUresult};\n",
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
            // `ffi::c_int`, with `use core::ffi;` (module_text), not `::core::ffi::c_int`.
            .args(["--ctypes-prefix", "ffi"])
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

fn module_text(m: &Module, generated: &str) -> Result<String> {
    let (rest, decls) = split_externs(generated)?;
    // The result codes get `name()`, their symbolic names known without the library.
    let result_ty = if m.result == "CUresult" {
        "cudaError_enum"
    } else {
        m.result
    };
    let rest = compact_types(&rest, result_ty)?;
    let names: Vec<&str> = decls.iter().map(|d| d.name.as_str()).collect();
    for f in m.functions {
        if !names.contains(f) {
            return Err(format!("{} declares no {f}", m.header));
        }
    }
    let mut out = format!(
        "//! {title}: GENERATED by `cargo xtask bindgen` from `{header}` of PyPI `{wheel}`.\n\
         //! An entry point the library lacks returns `{missing}` (see [`has`] and `crate::table`).\n\
         #![allow(nonstandard_style, missing_docs)]\n\n\
         {ffi}\n{prelude}\n{rest}\n",
        title = m.title,
        header = m.header,
        wheel = m.wheel,
        missing = m.missing,
        prelude = m.prelude,
        ffi = if generated.contains("ffi::") {
            "use core::ffi;\n"
        } else {
            ""
        },
    );
    // Every entry point's signature, once: p2p-sys's `table::entry_points!` makes of this list
    // the table, its loader, ENTRY_POINTS, has() and one wrapper function per entry point.
    out.push_str(&format!(
        "crate::table::entry_points! {{\n    library: {},\n    missing: {};\n",
        m.library, m.missing
    ));
    for d in &decls {
        // An entry that does not return the module's result type returns its own "missing".
        let own = if d.ret == m.result {
            ""
        } else if d.ret.starts_with("*const") {
            " = ::core::ptr::null()"
        } else {
            return Err(format!(
                "{} returns {}: no value stands for its absence",
                d.name, d.ret
            ));
        };
        let params: Vec<String> = d.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        out.push_str(&format!(
            "    fn {name}({params}) -> {ret}{own};\n",
            name = d.name,
            params = params.join(", "),
            ret = d.ret,
        ));
    }
    out.push_str("}\n\n");
    Ok(out)
}

/// One of bindgen's top-level items, by what the generated module makes of it.
enum Item {
    /// `#[repr(C)] #[derive(Debug)] pub struct name { _unused: [u8; 0], }`.
    Opaque(String),
    /// `pub type name = *mut to;`.
    Pointer { name: String, to: String },
    /// `pub type name = to;`.
    Alias { name: String, to: String },
    /// A Rust enum with bindgen's derives: `#[repr(repr)] ... pub enum name { V = value, .. }`.
    Enum {
        name: String,
        repr: String,
        variants: Vec<(String, String)>,
    },
    /// `#[repr(C)] #[derive(derives)] pub struct name { pub field: Type, .. }`.
    Struct {
        name: String,
        derives: String,
        fields: Vec<(String, String)>,
    },
    /// A newtype enum's type: `#[repr(transparent)] ... pub struct name(pub repr);`.
    Newtype { name: String, repr: String },
    /// `impl ty { pub const NAME: ty = ty(value); .. }` (`values`) or
    /// `impl ty { pub const NAME: ty = ty::OTHER; .. }` (`aliases`); never both.
    Consts {
        ty: String,
        values: Vec<(String, String)>,
        aliases: Vec<(String, String)>,
    },
    /// `pub use self::name as alias;`.
    UseAs { name: String, alias: String },
    /// Anything else, kept as bindgen wrote it.
    Other,
}

/// The derives bindgen gives an enum, Rust or newtype (and p2p-sys's `ctypes` macros repeat).
const ENUM_DERIVES: &str = "#[derive(Debug, Copy, Clone, Hash, PartialEq, Eq)]";

/// bindgen's top-level items in order, each with its attributes, as bindgen wrote them.
fn items(text: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut current = String::new();
    let mut depth = 0i32;
    for line in text.lines() {
        // A blank line stays with the item after it.
        current.push_str(line);
        current.push('\n');
        for c in line.chars() {
            match c {
                '{' | '(' | '[' => depth += 1,
                '}' | ')' | ']' => depth -= 1,
                _ => {}
            }
        }
        let line = line.trim();
        let ends = line.ends_with(';') || line.ends_with('}') || line.ends_with("*/");
        if depth == 0 && ends && !line.starts_with("#[") {
            items.push(std::mem::take(&mut current));
        }
    }
    if !current.trim().is_empty() {
        items.push(current);
    }
    items
}

/// The parts of `list` between the `sep`s outside brackets, trimmed, the empty ones left out.
fn split_top(list: &str, sep: char) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    let mut last = ' ';
    for (i, c) in list.char_indices() {
        let arrow = last == '-' && c == '>';
        last = c;
        match c {
            '(' | '[' | '<' | '{' => depth += 1,
            // The `>` of a function pointer's `->` closes nothing.
            '>' if arrow => {}
            ')' | ']' | '>' | '}' => depth -= 1,
            c if c == sep && depth == 0 => {
                parts.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(list[start..].trim());
    parts.retain(|p| !p.is_empty());
    parts
}

/// `(a, b)` pairs from `a<mid>b, c<mid>d,` (or `;`-separated).
fn pairs(list: &str, sep: char, mid: &str) -> Option<Vec<(String, String)>> {
    split_top(list, sep)
        .into_iter()
        .map(|p| {
            let (a, b) = p.split_once(mid)?;
            Some((a.trim().to_string(), b.trim().to_string()))
        })
        .collect()
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What one item is, from its text with the white space folded.
fn classify(flat: &str) -> Item {
    classify_opt(flat).unwrap_or(Item::Other)
}

fn classify_opt(flat: &str) -> Option<Item> {
    if let Some(name) = flat
        .strip_prefix("#[repr(C)] #[derive(Debug)] pub struct ")
        .and_then(|r| r.strip_suffix(" { _unused: [u8; 0], }"))
    {
        return is_ident(name).then(|| Item::Opaque(name.to_string()));
    }
    if let Some((name, to)) = flat
        .strip_prefix("pub type ")
        .and_then(|r| r.strip_suffix(';'))
        .and_then(|r| r.split_once(" = "))
    {
        let (pointer, to) = match to.strip_prefix("*mut ") {
            Some(to) => (true, to),
            None => (false, to),
        };
        if !is_ident(name) || !is_ident(to) {
            return None;
        }
        let (name, to) = (name.to_string(), to.to_string());
        return Some(match pointer {
            true => Item::Pointer { name, to },
            false => Item::Alias { name, to },
        });
    }
    if let Some(rest) = flat.strip_prefix("#[repr(C)] #[derive(") {
        let (derives, rest) = rest.split_once(")] pub struct ")?;
        let (name, body) = rest.split_once(" { ")?;
        let fields = pairs(body.strip_suffix('}')?, ',', ": ")?
            .into_iter()
            .map(|(field, ty)| Some((field.strip_prefix("pub ")?.to_string(), ty)))
            .collect::<Option<Vec<_>>>()?;
        let plain = |f: &(String, String)| is_ident(&f.0) && !f.1.contains('#');
        return (is_ident(name) && fields.iter().all(plain)).then(|| Item::Struct {
            name: name.to_string(),
            derives: derives.to_string(),
            fields,
        });
    }
    if let Some(rest) = flat.strip_prefix("#[repr(") {
        let (repr, rest) = rest.split_once(")] ")?;
        let rest = rest.strip_prefix(ENUM_DERIVES)?;
        if let Some(rest) = rest.strip_prefix(" pub enum ") {
            let (name, body) = rest.split_once(" { ")?;
            let variants = pairs(body.strip_suffix('}')?, ',', " = ")?;
            return (is_ident(name) && is_ident(repr) && !variants.is_empty()).then(|| {
                Item::Enum {
                    name: name.to_string(),
                    repr: repr.to_string(),
                    variants,
                }
            });
        }
        let (name, ty) = rest
            .strip_prefix(" pub struct ")?
            .strip_suffix(");")?
            .split_once("(pub ")?;
        return (repr == "transparent" && is_ident(name)).then(|| Item::Newtype {
            name: name.to_string(),
            repr: ty.to_string(),
        });
    }
    if let Some(rest) = flat.strip_prefix("impl ") {
        let (ty, body) = rest.split_once(" { ")?;
        let (mut values, mut aliases) = (Vec::new(), Vec::new());
        for (head, value) in pairs(body.strip_suffix('}')?, ';', " = ")? {
            let name = head
                .strip_prefix("pub const ")?
                .strip_suffix(&format!(": {ty}"))?;
            if let Some(v) = value
                .strip_prefix(&format!("{ty}("))
                .and_then(|v| v.strip_suffix(')'))
            {
                values.push((name.to_string(), v.to_string()));
            } else {
                let other = value.strip_prefix(&format!("{ty}::"))?;
                aliases.push((name.to_string(), other.to_string()));
            }
        }
        return (values.is_empty() != aliases.is_empty()).then(|| Item::Consts {
            ty: ty.to_string(),
            values,
            aliases,
        });
    }
    let (name, alias) = flat
        .strip_prefix("pub use self::")?
        .strip_suffix(';')?
        .split_once(" as ")?;
    Some(Item::UseAs {
        name: name.to_string(),
        alias: alias.to_string(),
    })
}

/// bindgen's types with every opaque handle, struct, Rust enum and newtype enum gathered into
/// one call of p2p-sys's `ctypes::handles!`, `ctypes::structs!`, `ctypes::enums!` and
/// `ctypes::newtype_enums!` (each where the first of its kind stood), which declare them as
/// bindgen does without writing the same attributes, derives and type names out again for
/// each; the newtype `named` (the module's result type) gets `name()`. Whatever else bindgen
/// wrote (constants, type aliases, unions) stays as it wrote it.
fn compact_types(rest: &str, named: &str) -> Result<String> {
    let texts = items(rest);
    let kinds: Vec<Item> = texts
        .iter()
        .map(|t| classify(&t.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect();
    let mut used = vec![false; texts.len()];
    // The first `pub use self::name as ..` of `name`, taken.
    let alias_of = |name: &str, used: &mut Vec<bool>| {
        let i = kinds
            .iter()
            .enumerate()
            .position(|(i, k)| !used[i] && matches!(k, Item::UseAs { name: n, .. } if n == name))?;
        used[i] = true;
        match &kinds[i] {
            Item::UseAs { alias, .. } => Some(alias.clone()),
            _ => None,
        }
    };
    // Every `impl name` of constants of one kind (values or aliases), taken.
    let consts_of = |name: &str, want_values: bool, used: &mut Vec<bool>| {
        let mut all = Vec::new();
        for (i, k) in kinds.iter().enumerate() {
            if let Item::Consts {
                ty,
                values,
                aliases,
            } = k
            {
                if ty == name && !used[i] && values.is_empty() != want_values {
                    used[i] = true;
                    all.extend(if want_values { values } else { aliases }.iter().cloned());
                }
            }
        }
        all
    };
    let (mut handles, mut enums, mut newtypes) = (String::new(), String::new(), String::new());
    let mut structs = String::new();
    // Where each call goes: the place of the first item of its kind.
    let (mut at_handles, mut at_enums, mut at_newtypes) = (None, None, None);
    let mut at_structs = None;
    for (i, kind) in kinds.iter().enumerate() {
        match kind {
            Item::Struct {
                name,
                derives,
                fields,
            } => {
                used[i] = true;
                at_structs.get_or_insert(i);
                if derives != "Debug, Copy, Clone" {
                    structs.push_str(&format!("    #[derive({derives})]\n"));
                }
                // Its typedefs: those of the struct, and those of them (`_v1` and the plain name).
                let mut names = vec![name.clone()];
                for (a, k) in kinds.iter().enumerate() {
                    if let Item::Alias { name: alias, to } = k {
                        if !used[a] && names.contains(to) {
                            used[a] = true;
                            names.push(alias.clone());
                        }
                    }
                }
                let aliases = match names.get(1..) {
                    Some(a) if !a.is_empty() => format!(" as {}", a.join(", ")),
                    _ => String::new(),
                };
                structs.push_str(&format!("    struct {name}{aliases} {{\n"));
                for (field, ty) in fields {
                    structs.push_str(&format!("        {field}: {ty},\n"));
                }
                structs.push_str("    }\n");
            }
            Item::Opaque(name) => {
                let pointer = kinds
                    .iter()
                    .position(|k| matches!(k, Item::Pointer { to, .. } if to == name));
                let Some(p) = pointer.filter(|&p| !used[p]) else {
                    continue;
                };
                let Item::Pointer { name: handle, .. } = &kinds[p] else {
                    continue;
                };
                used[i] = true;
                used[p] = true;
                at_handles.get_or_insert(i);
                handles.push_str(&format!("    {handle} = *mut {name},\n"));
            }
            Item::Enum {
                name,
                repr,
                variants,
            } => {
                used[i] = true;
                at_enums.get_or_insert(i);
                let alias = alias_of(name, &mut used)
                    .map(|a| format!(" as {a}"))
                    .unwrap_or_default();
                enums.push_str(&format!("    enum {name}: {repr}{alias} {{\n"));
                for (v, value) in variants {
                    enums.push_str(&format!("        {v} = {value},\n"));
                }
                let others = consts_of(name, false, &mut used);
                if others.is_empty() {
                    enums.push_str("    }\n");
                } else {
                    enums.push_str("    } aliases {\n");
                    for (other, same) in others {
                        enums.push_str(&format!("        {other} = {same},\n"));
                    }
                    enums.push_str("    }\n");
                }
            }
            Item::Newtype { name, repr } => {
                used[i] = true;
                at_newtypes.get_or_insert(i);
                if name == named {
                    newtypes.push_str("    #[named]\n");
                }
                let alias = alias_of(name, &mut used)
                    .map(|a| format!(" as {a}"))
                    .unwrap_or_default();
                newtypes.push_str(&format!("    {name}({repr}){alias} {{\n"));
                for (c, value) in consts_of(name, true, &mut used) {
                    newtypes.push_str(&format!("        {c} = {value},\n"));
                }
                newtypes.push_str("    }\n");
            }
            _ => {}
        }
    }
    if rest.contains(&format!("pub struct {named}(")) && !newtypes.contains("#[named]") {
        return Err(format!(
            "bindgen's {named} is not a newtype enum as expected"
        ));
    }
    let mut out = String::new();
    for (i, text) in texts.iter().enumerate() {
        for (at, mac, body) in [
            (at_handles, "handles", &handles),
            (at_structs, "structs", &structs),
            (at_enums, "enums", &enums),
            (at_newtypes, "newtype_enums", &newtypes),
        ] {
            if at == Some(i) {
                out.push_str(&format!("\ncrate::ctypes::{mac}! {{\n{body}}}\n\n"));
            }
        }
        if !used[i] {
            out.push_str(text);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bindgen's shapes, as it writes them.
    const GENERATED: &str = "/* automatically generated by rust-bindgen 0.73.2 */

pub const N_BYTES: u32 = 128;
#[repr(C)]
#[derive(Debug)]
pub struct comm_st {
    _unused: [u8; 0],
}
pub type comm_t = *mut comm_st;
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct id_st {
    pub internal: [ffi::c_char; 128usize],
}
pub type id_v1 = id_st;
pub type id_t = id_v1;
impl mode_enum {
    pub const MODE_SAME: mode_enum = mode_enum::MODE_A;
}
#[repr(u32)]
#[derive(Debug, Copy, Clone, Hash, PartialEq, Eq)]
pub enum mode_enum {
    MODE_A = 1,
    MODE_B = 2,
}
pub use self::mode_enum as mode;
impl result_t {
    pub const OK: result_t = result_t(0);
    pub const FAILED: result_t = result_t(2);
}
#[repr(transparent)]
#[derive(Debug, Copy, Clone, Hash, PartialEq, Eq)]
pub struct result_t(pub ffi::c_uint);
#[repr(C)]
#[derive(Copy, Clone)]
pub union value_union {
    pub a: ffi::c_int,
}
unsafe extern \"C\" {
    pub fn start(comm: *mut comm_t,
        id: id_t) -> result_t;
    pub fn describe(r: result_t) -> *const ffi::c_char;
}
";

    #[test]
    fn types_are_gathered_into_one_call_a_kind_and_the_rest_kept() {
        let (rest, decls) = split_externs(GENERATED).expect("extern block");
        assert_eq!(decls.len(), 2);
        assert_eq!(decls[0].params[1], ("id".to_string(), "id_t".to_string()));
        let text = compact_types(&rest, "result_t").expect("compacted");
        for expected in [
            "pub const N_BYTES: u32 = 128;\n",
            "crate::ctypes::handles! {\n    comm_t = *mut comm_st,\n}\n",
            "crate::ctypes::structs! {\n    struct id_st as id_v1, id_t {\n        \
             internal: [ffi::c_char; 128usize],\n    }\n}\n",
            "crate::ctypes::enums! {\n    enum mode_enum: u32 as mode {\n        MODE_A = 1,\n        \
             MODE_B = 2,\n    } aliases {\n        MODE_SAME = MODE_A,\n    }\n}\n",
            "crate::ctypes::newtype_enums! {\n    #[named]\n    result_t(ffi::c_uint) {\n        \
             OK = 0,\n        FAILED = 2,\n    }\n}\n",
            "#[repr(C)]\n#[derive(Copy, Clone)]\npub union value_union {\n",
        ] {
            assert!(text.contains(expected), "{expected}\nnot in\n{text}");
        }
        for gone in [
            "_unused",
            "impl ",
            "pub use",
            "#[repr(u32)]",
            "pub type id_t",
        ] {
            assert!(!text.contains(gone), "{gone} left in\n{text}");
        }
    }

    #[test]
    fn fields_split_only_outside_brackets() {
        let fields = "pub f: Option<unsafe extern \"C\" fn(a: u8, b: u8) -> u8>, pub g: [u8; 4],";
        assert_eq!(
            split_top(fields, ','),
            [
                "pub f: Option<unsafe extern \"C\" fn(a: u8, b: u8) -> u8>",
                "pub g: [u8; 4]"
            ]
        );
    }

    #[test]
    fn a_result_type_that_is_not_a_newtype_enum_is_an_error() {
        let odd = "#[repr(transparent)]\n#[derive(Debug)]\npub struct result_t(pub u32);\n";
        let err = compact_types(odd, "result_t").expect_err("not compacted");
        assert!(err.contains("result_t"), "{err}");
    }
}
