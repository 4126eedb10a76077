#!/bin/sh
if [ "$RANK" = 1 ]; then exit 3; fi
P2P_RENDEZVOUS_TIMEOUT_MS=60000 exec "/work/main/target/b37/p2p-bench" held-memory --cycles 1
