//! p2p-mem
