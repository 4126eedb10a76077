use super::*;
use crate::error::Error;
use std::time::{Duration, Instant};

#[test]
fn a_compile_past_its_limit_says_what_goes_on_and_what_to_do() {
    let e = Error::CompileTimeout {
        kernels: "coll.cu [COLL_PART=0]".into(),
        arch: "sm_100".into(),
        limit: COMPILE_LIMIT,
    };
    let text = e.to_string();
    for part in [
        "coll.cu [COLL_PART=0]",
        "sm_100",
        "600s",
        "fills the kernel cache",
        "P2P_KERNELS=shipped",
        "p2p-bench kernels",
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
}

#[test]
fn a_compile_lock_waits_for_its_holder_gives_up_at_its_limit_and_is_free_once_dropped() {
    let dir = std::env::temp_dir().join(format!("p2p-compile-lock-{}", std::process::id()));
    let first = compile_lock(&dir, 7, Duration::ZERO).expect("a free lock");
    // Held: another holder (its own open file, as another process has) waits, then gives up.
    let t = Instant::now();
    assert!(compile_lock(&dir, 7, Duration::from_millis(200)).is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    // Another set of kernels has its own lock.
    assert!(compile_lock(&dir, 8, Duration::ZERO).is_some());
    // Released when the holder lets go, while a waiter waits.
    let waiter = std::thread::spawn({
        let dir = dir.clone();
        move || {
            let t = Instant::now();
            (
                compile_lock(&dir, 7, Duration::from_secs(10)).map(|l| l.waited),
                t.elapsed(),
            )
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(first);
    let (got, waited) = waiter.join().expect("the waiter");
    assert_eq!(
        got,
        Some(true),
        "the lock was handed over to one that waited"
    );
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_last_holder_removes_the_lock_file_but_never_a_newer_one() {
    let dir = std::env::temp_dir().join(format!("p2p-compile-gone-{}", std::process::id()));
    let path = dir.join(format!("{:016x}.lock", 11));
    let first = compile_lock(&dir, 11, Duration::ZERO).expect("a free lock");
    assert!(path.exists());
    // A waiter has opened the same file before the holder lets go (as compile_lock does
    // before it polls), and takes its lock after.
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    drop(first);
    assert!(!path.exists(), "removed by the holder as it let go");
    rustix::fs::flock(
        &opened,
        rustix::fs::FlockOperation::NonBlockingLockExclusive,
    )
    .expect("the removed file's lock is free");
    let waiter = CompileLock {
        file: opened,
        waited: true,
        path: Some(path.clone()),
    };
    // A later process makes a new file and holds its lock beside the waiter (on the
    // removed one); the waiter, done, leaves the new file alone.
    let later = compile_lock(&dir, 11, Duration::ZERO).expect("a new lock file");
    drop(waiter);
    assert!(
        path.exists(),
        "the later holder's file stays while it holds it"
    );
    drop(later);
    assert!(!path.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_waiter_learns_that_the_holder_it_waited_for_failed_and_a_later_process_compiles_anew() {
    let dir = std::env::temp_dir().join(format!("p2p-compile-fail-{}", std::process::id()));
    let holder = compile_lock(&dir, 9, Duration::ZERO).expect("a free lock");
    assert!(!holder.waited);
    holder.record(None);
    holder.record(Some("coll.cu: error: something \u{e9}"));
    // What the next holder sees of the record, had it waited or not (compile_lock's own
    // test shows that a holder that waited knows it).
    let next = |waited| {
        let file = std::fs::File::open(dir.join(format!("{:016x}.lock", 9))).expect("open");
        CompileLock {
            file,
            waited,
            path: None,
        }
        .failure()
    };
    assert_eq!(
        next(true).as_deref(),
        Some("coll.cu: error: something \u{e9}")
    );
    // One that did not wait takes the record for an earlier run's (and clears it as it
    // compiles).
    assert_eq!(next(false), None);
    holder.record(None);
    assert_eq!(
        next(true),
        None,
        "cleared: the holder it waited for succeeded"
    );
    drop(holder);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An ELF64 header whose one section header (64 bytes) lies at 64, and that table.
fn tiny_elf() -> Vec<u8> {
    let mut c = vec![0u8; 128];
    c[..6].copy_from_slice(b"\x7fELF\x02\x01");
    c[0x28] = 64; // e_shoff
    c[0x3a] = 64; // e_shentsize
    c[0x3c] = 1; // e_shnum
    c
}

#[test]
fn only_whole_cubins_and_terminated_ptx_reach_the_driver() {
    // tiny_elf's one section header is at 64..128, all zeros: a null section.
    let elf = tiny_elf();
    assert!(check_image(&elf).is_ok());
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut c = tiny_elf();
        f(&mut c);
        c
    };
    let set = |c: &mut Vec<u8>, at: usize, v: u64| c[at..at + 8].copy_from_slice(&v.to_le_bytes());
    // A section whose contents end past the image (offset 100, 64 bytes).
    let past = with(&|c| {
        set(c, 64 + 0x18, 100);
        set(c, 64 + 0x20, 64);
    });
    assert!(check_image(&past).is_err());
    // The same as SHT_NOBITS (no bytes in the file): fine.
    let nobits = with(&|c| {
        set(c, 64 + 0x18, 100);
        set(c, 64 + 0x20, 64);
        c[64 + 4] = 8;
    });
    assert!(check_image(&nobits).is_ok());
    // Offsets that overflow, a program header table past the end, a short entry size.
    let wraps = with(&|c| {
        set(c, 64 + 0x18, u64::MAX);
        set(c, 64 + 0x20, 2);
    });
    assert!(check_image(&wraps).is_err());
    let segments = with(&|c| {
        set(c, 0x20, 120);
        c[0x36] = 0x38;
        c[0x38] = 1;
    });
    assert!(check_image(&segments).is_err());
    let short = with(&|c| c[0x3a] = 16);
    assert!(check_image(&short).is_err());
    assert!(check_image(&elf[..100]).is_err());
    // PTX is text the driver reads to its NUL.
    assert!(check_image(b".version 8.0\n.target sm_90\n\0").is_ok());
    let e = check_image(b".version 8.0").expect_err("no NUL");
    assert!(e.to_string().contains("NUL-terminated PTX"), "{e}");
    assert!(check_image(b"").is_err());
    // A fatbin (its magic is not text), binary data with a NUL somewhere, an empty string.
    assert!(check_image(&[0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0]).is_err());
    assert!(check_image(b"abc\xff\0").is_err());
    assert!(check_image(b"\0").is_err());
    // A section-name table index past the sections.
    let names = with(&|c| c[0x3e] = 1);
    assert!(check_image(&names).is_err());
}

#[test]
fn a_cache_file_that_is_not_a_whole_cubin_is_a_miss() {
    let dir = std::env::temp_dir().join(format!("p2p-cubin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let source = Source {
        name: "k.cu",
        code: "",
        defines: &[],
        shipped: &[],
    };
    let elf = tiny_elf();
    let cases: [(&str, &[u8], bool); 4] = [
        ("whole.cubin", &elf, true),
        ("cut.cubin", &elf[..100], false),
        ("empty.cubin", b"", false),
        ("junk.cubin", b"half a write", false),
    ];
    for (name, bytes, hit) in cases {
        let f = dir.join(name);
        std::fs::write(&f, bytes).expect("written");
        assert_eq!(
            read_cubin(Some(&f), &source, "sm_90").is_some(),
            hit,
            "{name}"
        );
    }
    assert!(read_cubin(Some(&dir.join("none.cubin")), &source, "sm_90").is_none());
    assert!(read_cubin(None, &source, "sm_90").is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_write_lands_whole_under_its_name_and_leaves_no_temporary_file() {
    let dir = std::env::temp_dir().join(format!("p2p-store-{}", std::process::id()));
    let file = dir.join("k.cu-sm_90-0123.cubin");
    store(&dir, &file, &tiny_elf()).expect("stored");
    assert!(whole_elf(&std::fs::read(&file).expect("read back")));
    let names: Vec<_> = std::fs::read_dir(&dir)
        .expect("the folder")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    // A folder that cannot be made: an error, and nothing left behind.
    let blocked = dir.join("k.cu-sm_90-0123.cubin").join("sub");
    assert!(store(&blocked, &blocked.join("x.cubin"), &tiny_elf()).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_cache_key_changes_with_every_part_of_a_compile() {
    let base = Source {
        name: "k.cu",
        code: "a",
        defines: &["X=1"],
        shipped: &[],
    };
    let nvrtc = |version, build_id: Option<&str>| Compiler {
        version,
        file: None,
        build_id: build_id.map(String::from),
    };
    let c13 = nvrtc((13, 0), Some("65be0db3"));
    let key = |s: &Source, arch: &str| cache_key(s, arch, &c13);
    let k = key(&base, "sm_90");
    assert_eq!(k, key(&base, "sm_90"));
    assert_ne!(k, key(&Source { code: "b", ..base }, "sm_90"));
    let x2 = Source {
        defines: &["X=2"],
        ..base
    };
    assert_ne!(k, key(&x2, "sm_90"));
    let plain = Source {
        defines: &[],
        ..base
    };
    assert_ne!(k, key(&plain, "sm_90"));
    assert_ne!(k, key(&base, "sm_80"));
    for other in [
        nvrtc((13, 1), Some("65be0db3")),
        nvrtc((12, 0), Some("65be0db3")),
        // A patch release: the same major.minor, another library.
        nvrtc((13, 0), Some("0e1f0a2b")),
        nvrtc((13, 0), None),
    ] {
        assert_ne!(k, cache_key(&base, "sm_90", &other), "{other}");
    }
}
