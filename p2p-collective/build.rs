//! The collectives' kernel interface, `src/kernels/coll_abi.h`, as Rust (`crate::abi`): see
//! p2p-abigen for the forms the header keeps to.

fn main() {
    p2p_abigen::generate("src/kernels/coll_abi.h", "coll_abi.rs");
}
