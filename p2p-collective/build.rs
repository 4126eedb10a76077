//! The collectives' kernel interface, `src/kernels/coll_abi.h`, as Rust (`crate::abi`: see
//! p2p-abigen for the forms the header keeps to), and the collective program: every kernel file
//! of `src/kernels/coll/algo/` and `src/kernels/coll/proto/` and the send/recv kernel, with what
//! they include, flattened into `$OUT_DIR/coll.cu` (`p2p_abigen::program`).

fn main() {
    p2p_abigen::generate("src/kernels/coll_abi.h", "coll_abi.rs");
    p2p_abigen::generate_program(
        "src/kernels",
        &["coll/algo/*.cuh", "coll/proto/*.cuh", "coll/p2p.cuh"],
        "coll.cu",
    );
}
