//! One process per GPU, started by a launcher: torchrun
//! (`torchrun --standalone --nproc_per_node=2 --no-python ./torchrun_job`) or `p2p-bench launch -n 2 --
//! ./torchrun_job`. Each rank joins the communicator from the launcher's environment (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, and torchrun's `MASTER_ADDR`/`MASTER_PORT`/
//! `TORCHELASTIC_RUN_ID` as the job's identity; no port of its own), then all-reduces and
//! all-gathers cudarc slices on its own stream and checks every element. Rank 0 prints the
//! summary; any rank exits non-zero on a wrong element or an error.

use cudarc::driver::CudaContext;
use p2p_collective::{Collectives, Communicator, DataType, RedOp};
use p2p_examples::{count_wrong, run, sum, value, BoxError};
use p2p_mem::cudarc_interop::{view, view_mut};
use p2p_mem::Stream;

const COUNTS: [usize; 4] = [1, 1023, 65_537, (1 << 20) + 5];

fn main() {
    run("torchrun_job", job);
}

fn job() -> Result<(), BoxError> {
    let comm = Communicator::from_env()?;
    let (rank, n) = (comm.rank(), comm.world_size());
    if n < 2 {
        return Err("this example needs at least 2 ranks".into());
    }
    let ctx = CudaContext::new(comm.device().ordinal() as usize)?;
    let cu_stream = ctx.new_stream()?;
    let stream = Stream::from_cudarc(comm.device(), &cu_stream)?;
    let mut wrong = 0;
    for (step, &count) in COUNTS.iter().enumerate() {
        let mine: Vec<f32> = (0..count).map(|i| value(rank, i, step)).collect();
        let mut x = cu_stream.clone_htod(&mine)?;
        let mut gathered = cu_stream.alloc_zeros::<f32>(count * n)?;
        {
            let mut xv = view_mut(&stream, &mut x)?;
            comm.all_reduce_in_place(&mut xv, count, DataType::F32, RedOp::Sum, &stream)?;
        }
        {
            let src = cu_stream.clone_htod(&mine)?;
            let sv = view(&stream, &src)?;
            let mut gv = view_mut(&stream, &mut gathered)?;
            comm.all_gather(&sv, &mut gv, count, DataType::F32, &stream)?;
            drop((sv, gv));
            comm.synchronize(&stream)?;
        }
        let reduced: Vec<f32> = cu_stream.clone_dtoh(&x)?;
        wrong += count_wrong(
            &format!("rank {rank} all-reduce of {count}"),
            &reduced,
            |i| sum(n, i, step),
        );
        let all: Vec<f32> = cu_stream.clone_dtoh(&gathered)?;
        wrong += count_wrong(&format!("rank {rank} all-gather of {count}"), &all, |i| {
            value(i / count, i % count, step)
        });
    }
    if rank == 0 {
        println!(
            "torchrun_job: {n} ranks (one process per GPU, workspaces via {}), all-reduce and all-gather of {COUNTS:?} f32 in cudarc slices: rank 0 saw {wrong} wrong",
            comm.sharing().name()
        );
    }
    if wrong > 0 {
        return Err(format!("rank {rank}: {wrong} wrong elements").into());
    }
    Ok(())
}
