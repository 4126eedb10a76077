//! Kernels shipped compiled: each crate embeds the cubins of its sources for the architectures
//! p2p supports (one zstd-compressed archive per crate, made by `cargo xtask kernels` with
//! NVRTC 12.4, so that any driver from CUDA 12.4 loads them), and [`super::compile_cached_all`]
//! takes them before any compiler: the first communicator starts without libnvrtc.
//!
//! An image is used only where its key matches the source as it is now (the code, its macros,
//! the target and the compile options; [`key`]): a source edited since the archive was made
//! compiles with NVRTC as before, and CI fails until the archive is made again ([`check`]).
//!
//! The archive, before compression: `P2PKERN1`, then little-endian: the compiler's description
//! (u16 length, text), the image count (u32), and per image its label (u16 length, text), its
//! target (u16 length, text), its key (u64) and its bytes (u32 length, bytes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::{digest64, options, Source};

const MAGIC: &[u8; 8] = b"P2PKERN1";
/// Part of every key: a change of the key's recipe invalidates every archive.
const KEY_FORMAT: &str = "p2p-shipped-2";
/// The targets every archive holds (what `cargo xtask kernels` compiles, and CI checks).
pub const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// The key of `source` compiled for `arch`: a hash of the code, the target, the options and the
/// macros. Unlike the disk cache's, it leaves the compiler out: the archive says which one.
pub fn key(source: &Source, arch: &str) -> u64 {
    let options = options(arch);
    let mut parts = vec![
        KEY_FORMAT.as_bytes(),
        source.code.as_bytes(),
        arch.as_bytes(),
    ];
    parts.extend(options.iter().map(|o| o.as_bytes()));
    parts.extend(source.defines.iter().map(|d| d.as_bytes()));
    digest64(&parts)
}

/// One compiled image, as [`write()`] takes it.
pub struct Image<'a> {
    /// The source it was compiled from.
    pub source: &'a Source,
    /// Its target, e.g. `sm_90`.
    pub arch: &'a str,
    /// The cubin.
    pub cubin: &'a [u8],
}

/// The archive of `images` (uncompressed), naming `compiler` (e.g. `NVRTC 12.4`).
pub fn write(compiler: &str, images: &[Image<'_>]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    let text = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u16).to_le_bytes());
        out.extend(s.as_bytes());
    };
    text(&mut out, compiler);
    out.extend((images.len() as u32).to_le_bytes());
    for i in images {
        text(&mut out, &i.source.label());
        text(&mut out, i.arch);
        out.extend(key(i.source, i.arch).to_le_bytes());
        out.extend((i.cubin.len() as u32).to_le_bytes());
        out.extend(i.cubin);
    }
    out
}

/// Why a shipped-kernel archive does not decode. Offsets count from the start of the
/// decompressed archive (its magic included).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// The bytes do not start a zstd frame.
    #[error("not zstd: {0}")]
    NotZstd(#[source] std::io::Error),
    /// The zstd stream does not decompress (corrupt or cut).
    #[error("cannot decompress: {0}")]
    Decompress(#[source] std::io::Error),
    /// The decompressed bytes do not start with `P2PKERN1`.
    #[error("not a p2p kernel archive (bad magic)")]
    BadMagic,
    /// A field runs past the end of the archive: it was cut, or made by another format.
    #[error("cut short at byte {at}: {field} needs {needed} bytes, {left} left")]
    CutShort {
        /// Where the field starts.
        at: usize,
        /// Which field, e.g. `an image's bytes`.
        field: &'static str,
        /// The bytes it needs.
        needed: usize,
        /// The bytes left from `at`.
        left: usize,
    },
    /// A name in the archive is not UTF-8.
    #[error("a name is not UTF-8 ({field} at byte {at})")]
    NotUtf8 {
        /// Where the name starts.
        at: usize,
        /// Which name, e.g. `an image's target`.
        field: &'static str,
    },
}

/// An archive, decoded.
#[derive(Debug, Default)]
pub struct Archive {
    /// The compiler that made it.
    pub compiler: String,
    /// The images by (target, key).
    images: HashMap<(String, u64), Vec<u8>>,
}

/// Reads an archive's fields in order, knowing where it is (for [`ArchiveError`]).
struct Fields<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    /// What is left from here.
    fn rest(&self) -> &'a [u8] {
        self.raw.get(self.at..).unwrap_or_default()
    }

    /// The error for the `field` of `needed` bytes that does not fit what is left.
    fn cut(&self, field: &'static str, needed: usize) -> ArchiveError {
        ArchiveError::CutShort {
            at: self.at,
            field,
            needed,
            left: self.rest().len(),
        }
    }

    /// The next `n` bytes, the `field`.
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], ArchiveError> {
        let head = self.rest().get(..n).ok_or_else(|| self.cut(field, n))?;
        self.at += n;
        Ok(head)
    }

    /// The next `N` bytes, as an array.
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], ArchiveError> {
        let head = *self
            .rest()
            .first_chunk::<N>()
            .ok_or_else(|| self.cut(field, N))?;
        self.at += N;
        Ok(head)
    }

    /// A u16 length, then that many bytes of UTF-8: the `field`.
    fn text(&mut self, field: &'static str) -> Result<String, ArchiveError> {
        let n = u16::from_le_bytes(self.array(field)?);
        let at = self.at;
        let bytes = self.take(n.into(), field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ArchiveError::NotUtf8 { at, field })
    }
}

impl Archive {
    /// Decodes a zstd-compressed archive; `None` for an empty slice (a crate that ships none).
    pub fn decode(compressed: &[u8]) -> Result<Option<Archive>, ArchiveError> {
        if compressed.is_empty() {
            return Ok(None);
        }
        let mut raw = Vec::new();
        let mut decoder = ruzstd::streaming_decoder::StreamingDecoder::new(compressed)
            .map_err(|e| ArchiveError::NotZstd(std::io::Error::other(e)))?;
        std::io::Read::read_to_end(&mut decoder, &mut raw).map_err(ArchiveError::Decompress)?;
        Archive::parse(&raw).map(Some)
    }

    fn parse(raw: &[u8]) -> Result<Archive, ArchiveError> {
        if !raw.starts_with(MAGIC) {
            return Err(ArchiveError::BadMagic);
        }
        let mut f = Fields {
            raw,
            at: MAGIC.len(),
        };
        let mut archive = Archive {
            compiler: f.text("the compiler's name")?,
            ..Archive::default()
        };
        let count = u32::from_le_bytes(f.array("the image count")?);
        for _ in 0..count {
            let n = u16::from_le_bytes(f.array("an image's label")?);
            let _label = f.take(n.into(), "an image's label")?;
            let arch = f.text("an image's target")?;
            let key = u64::from_le_bytes(f.array("an image's key")?);
            let n = u32::from_le_bytes(f.array("an image's bytes")?);
            let cubin = f.take(n as usize, "an image's bytes")?.to_vec();
            archive.images.insert((arch, key), cubin);
        }
        Ok(archive)
    }

    /// The image of `source` for `arch` as it is now, if shipped.
    pub fn get(&self, source: &Source, arch: &str) -> Option<&[u8]> {
        self.images
            .get(&(arch.to_string(), key(source, arch)))
            .map(Vec::as_slice)
    }
}

/// The targets whose cubins run on `arch`, best first: itself, then the same major
/// architecture's earlier minors (an `sm_80` cubin runs on `sm_86` and `sm_89`; nothing crosses
/// a major version, and the `a` variants run only on themselves).
pub fn runs_on(arch: &str) -> Vec<String> {
    let Some(digits) = arch.strip_prefix("sm_") else {
        return vec![arch.to_string()];
    };
    let Ok(n) = digits.parse::<u32>() else {
        return vec![arch.to_string()];
    };
    let (major, minor) = (n / 10, n % 10);
    (0..=minor)
        .rev()
        .map(|m| format!("sm_{}", major * 10 + m))
        .collect()
}

/// The decoded archive of `compressed` (once per process; the bytes are a crate's static
/// `include_bytes!`, so their address names them). `None` for none or one that does not
/// decode (logged once).
fn archive(compressed: &'static [u8]) -> Option<Arc<Archive>> {
    static DECODED: OnceLock<Mutex<HashMap<usize, Option<Arc<Archive>>>>> = OnceLock::new();
    let map = DECODED.get_or_init(Default::default);
    let mut map = map.lock().ok()?;
    map.entry(compressed.as_ptr() as usize)
        .or_insert_with(|| match Archive::decode(compressed) {
            Ok(a) => a.map(Arc::new),
            Err(e) => {
                tracing::warn!("the shipped kernels do not decode ({e}); compiling with NVRTC");
                None
            }
        })
        .clone()
}

/// The shipped cubins of every one of `sources` for `arch` (or a target that runs on it), or
/// `None` if any is not shipped as it is now.
pub(super) fn cubins(sources: &[Source], arch: &str) -> Option<Vec<Vec<u8>>> {
    let targets = runs_on(arch);
    let mut out = Vec::with_capacity(sources.len());
    for source in sources {
        let archive = archive(source.shipped)?;
        let cubin = targets.iter().find_map(|t| archive.get(source, t))?;
        out.push(cubin.to_vec());
    }
    tracing::debug!(%arch, kernels = sources.len(), "kernels shipped compiled; no NVRTC needed");
    Some(out)
}

/// Whether every one of `sources` ships compiled for `arch` (or a target whose cubins run on
/// it), as it is now: then [`super::compile_cached_all`] needs no compiler for them.
pub fn available(sources: &[Source], arch: &str) -> bool {
    let targets = runs_on(arch);
    sources.iter().all(|source| {
        archive(source.shipped).is_some_and(|a| targets.iter().any(|t| a.get(source, t).is_some()))
    })
}

/// What is wrong with the shipped images of `sources`: each one not shipped, or shipped for an
/// older version of its source, for each of [`ARCHS`]. Empty when all are current. For each
/// crate's test that keeps its archive fresh.
pub fn check(sources: &[Source]) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut decoded: HashMap<usize, Result<Option<Archive>, ArchiveError>> = HashMap::new();
    for source in sources {
        let archive = decoded
            .entry(source.shipped.as_ptr() as usize)
            .or_insert_with(|| Archive::decode(source.shipped));
        let archive = match archive {
            Ok(Some(a)) => a,
            Ok(None) => {
                wrong.push(format!("{}: ships no archive", source.label()));
                continue;
            }
            Err(e) => {
                wrong.push(format!("{}: its archive {e}", source.label()));
                continue;
            }
        };
        for arch in ARCHS {
            if archive.get(source, arch).is_none() {
                wrong.push(format!(
                    "{} for {arch}: not shipped, or shipped for an older version of the source",
                    source.label()
                ));
            }
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Source = Source {
        name: "a.cu",
        code: "extern \"C\" __global__ void a() {}",
        defines: &[],
        shipped: &[],
    };

    #[test]
    fn an_archive_round_trips_and_keys_follow_the_source() {
        let b = Source {
            defines: &["X=1"],
            ..A
        };
        let raw = write(
            "NVRTC 12.4",
            &[
                Image {
                    source: &A,
                    arch: "sm_80",
                    cubin: b"one",
                },
                Image {
                    source: &b,
                    arch: "sm_90",
                    cubin: b"two",
                },
            ],
        );
        let archive = Archive::parse(&raw).expect("parses");
        assert_eq!(archive.compiler, "NVRTC 12.4");
        assert_eq!(archive.get(&A, "sm_80"), Some(&b"one"[..]));
        assert_eq!(archive.get(&b, "sm_90"), Some(&b"two"[..]));
        assert_eq!(archive.get(&A, "sm_90"), None);
        // An edited source, or other macros, is not the shipped one.
        let edited = Source {
            code: "extern \"C\" __global__ void a() { }",
            ..A
        };
        assert_eq!(archive.get(&edited, "sm_80"), None);
        assert_eq!(archive.get(&Source { defines: &[], ..b }, "sm_90"), None);
        assert!(Archive::parse(&raw[..raw.len() - 1]).is_err());
        assert!(Archive::parse(b"P2PKERN0").is_err());
        assert!(matches!(Archive::decode(&[]), Ok(None)));
        assert!(Archive::decode(b"not zstd").is_err());
    }

    #[test]
    fn a_broken_archive_says_where_and_what() {
        let raw = write(
            "NVRTC 12.4",
            &[Image {
                source: &A,
                arch: "sm_80",
                cubin: b"one",
            }],
        );
        // The last image's bytes lack one: they start 3 bytes before the end.
        let e = Archive::parse(&raw[..raw.len() - 1]).expect_err("cut");
        assert!(
            matches!(
                e,
                ArchiveError::CutShort {
                    field: "an image's bytes",
                    needed: 3,
                    left: 2,
                    ..
                }
            ),
            "{e:?}"
        );
        let at = raw.len() - 3;
        assert_eq!(
            e.to_string(),
            format!("cut short at byte {at}: an image's bytes needs 3 bytes, 2 left")
        );
        let e = Archive::parse(b"P2PKERN0").expect_err("magic");
        assert!(matches!(e, ArchiveError::BadMagic), "{e:?}");
        assert_eq!(e.to_string(), "not a p2p kernel archive (bad magic)");
        // The compiler's name: 2 bytes of length, then bytes that are not UTF-8.
        let mut bad = MAGIC.to_vec();
        bad.extend([2, 0, 0xff, 0xfe]);
        let e = Archive::parse(&bad).expect_err("UTF-8");
        assert!(
            matches!(
                e,
                ArchiveError::NotUtf8 {
                    at: 10,
                    field: "the compiler's name"
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "a name is not UTF-8 (the compiler's name at byte 10)"
        );
        let e = Archive::decode(b"not zstd").expect_err("zstd");
        assert!(matches!(e, ArchiveError::NotZstd(_)), "{e:?}");
        assert!(e.to_string().starts_with("not zstd: "), "{e}");
    }

    #[test]
    fn cubins_run_on_later_minors_of_their_major_only() {
        assert_eq!(
            runs_on("sm_89"),
            [
                "sm_89", "sm_88", "sm_87", "sm_86", "sm_85", "sm_84", "sm_83", "sm_82", "sm_81",
                "sm_80"
            ]
        );
        assert_eq!(runs_on("sm_90"), ["sm_90"]);
        assert_eq!(runs_on("sm_100"), ["sm_100"]);
        assert_eq!(runs_on("sm_90a"), ["sm_90a"]);
    }

    #[test]
    fn a_source_without_an_archive_is_reported() {
        let wrong = check(&[A]);
        assert_eq!(wrong, ["a.cu: ships no archive"]);
    }
}
