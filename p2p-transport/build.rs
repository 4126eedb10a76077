//! The send/recv kernels' interface, `src/kernels/sendrecv_abi.h`, as Rust
//! (`crate::kernels::abi`): see p2p-abigen for the forms the header keeps to.

fn main() {
    p2p_abigen::generate("src/kernels/sendrecv_abi.h", "sendrecv_abi.rs");
}
