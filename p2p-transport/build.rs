//! The transport kernels' interface, `src/kernels/transport_abi.h`, as Rust
//! (`crate::kernels::abi`): see p2p-abigen for the forms the header keeps to.

fn main() {
    p2p_abigen::generate("src/kernels/transport_abi.h", "transport_abi.rs");
}
