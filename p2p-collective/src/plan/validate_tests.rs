use super::*;

#[test]
fn tuning_values_that_would_break_the_kernels_are_refused() {
    let ok = Tuning::for_device(132, 2);
    assert_eq!(ok.validate(264, 8), Ok(()));
    let bad = [
        Tuning {
            max_blocks: 0,
            ..ok
        },
        Tuning {
            max_blocks: MAX_BLOCKS + 1,
            ..ok
        },
        Tuning {
            piece_bytes: 0,
            ..ok
        },
        Tuning {
            piece_bytes: usize::MAX / 2,
            ..ok
        },
        Tuning {
            block_bytes: 0,
            ..ok
        },
        Tuning {
            ll_max_bytes: LL_MAX_BYTES + 1,
            ..ok
        },
        Tuning {
            piece_bytes: (64 << 10) + 4,
            ..ok
        },
        Tuning {
            pipe_sub_bytes: 0,
            ..ok
        },
        Tuning {
            pipe_sub_bytes: 4100,
            ..ok
        },
        Tuning {
            ce_streams: 0,
            ..ok
        },
        Tuning {
            ce_streams: 3,
            ..ok
        },
        Tuning {
            overlap_chunks: 0,
            ..ok
        },
        Tuning {
            overlap_chunks: MAX_OVERLAP_CHUNKS + 1,
            ..ok
        },
    ];
    assert_eq!(
        Tuning {
            ce_streams: 2,
            ..ok
        }
        .validate(264, 8),
        Ok(())
    );
    for t in bad {
        assert!(t.validate(264, 8).is_err(), "{t:?} accepted");
    }
    // More blocks than the GPU holds at once (132 SMs x 1 resident).
    let one_per_sm = |max_blocks| Tuning { max_blocks, ..ok }.validate(132, 8);
    assert_eq!(one_per_sm(132), Ok(()));
    assert!(one_per_sm(200).is_err());
    assert_eq!(
        Tuning {
            overlap_chunks: MAX_OVERLAP_CHUNKS,
            overlap_min_bytes: 0,
            ..ok
        }
        .validate(264, 8),
        Ok(())
    );
}

#[test]
fn ranks_sharing_a_gpu_split_its_resident_blocks() {
    // H100/H200: 132 SMs x 2 blocks = 264 resident, capped at MAX_BLOCKS.
    let one = Tuning::for_device(132, 2);
    assert_eq!(one.shared_by(1), one);
    assert_eq!(one.shared_by(0), one);
    for k in 2..=MAX_RANKS {
        let t = one.shared_by(k);
        assert_eq!(t.max_blocks, one.max_blocks / k as u32);
        // Every rank's grid fits beside the others', and the rest is unchanged.
        assert!(t.max_blocks as usize * k <= 264, "{k} ranks: {t:?}");
        assert_eq!(t.validate(264 / k as u32, k), Ok(()));
        assert_eq!(
            Tuning {
                max_blocks: one.max_blocks,
                ..t
            },
            one
        );
    }
    // Never below one block, whatever the share.
    let small = Tuning {
        max_blocks: 3,
        ..one
    };
    assert_eq!(small.shared_by(8).max_blocks, 1);
    assert_eq!(small.shared_by(usize::MAX).max_blocks, 1);
}
