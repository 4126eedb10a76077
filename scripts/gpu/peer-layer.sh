#!/usr/bin/env bash
# Issue 13 on a machine of two or more GPUs: the collective suites with the workspaces shared
# each way the peer layer can share them. One process per GPU: cuMem fds (default), legacy IPC
# (P2P_CUMEM=0); every test host-staged (P2P_DISABLE=1), one process and one per GPU. The
# default run also checks plain pointers and host-staged in one process (gpu2_sharing_*).
# Usage: peer-layer.sh   Results: $OUT/tests-default.tgz, tests-ipc.tgz, tests-host.tgz
here=$(cd "$(dirname "$0")" && pwd)
cd "$here" || exit 1
TEST_TIMEOUT=${TEST_TIMEOUT:-300} BATCH=tests-default ./scale-tests.sh 2
P2P_CUMEM=0 GPU_COLL_FILTER=gpu2_sharing TEST_TIMEOUT=300 BATCH=tests-ipc ./scale-tests.sh 2
P2P_DISABLE=1 TEST_TIMEOUT=${HOST_TIMEOUT:-400} BATCH=tests-host ./scale-tests.sh 2
