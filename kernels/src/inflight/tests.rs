use super::*;

fn c(src: u32, dst: u32) -> BlockCopy {
    BlockCopy { src, dst }
}

#[test]
fn restore_into_a_block_being_evicted_is_refused() {
    let mut f = InFlight::default();
    f.insert(1, &[], &[c(5, 9)]); // evict HBM 5 -> DRAM 9
    let err = f.check(&[c(3, 5)], &[]).unwrap_err();
    assert_eq!(
        err,
        Conflict {
            tier: Tier::Hbm,
            block: 5,
            access: Access::Write,
            with_batch: Some(1)
        }
    );
    f.complete(1);
    assert!(f.check(&[c(3, 5)], &[]).is_ok());
}

#[test]
fn restore_of_other_blocks_may_race_an_eviction() {
    let mut f = InFlight::default();
    f.insert(1, &[], &[c(5, 9), c(6, 10)]);
    assert!(f.check(&[c(11, 7), c(12, 8)], &[]).is_ok());
}

#[test]
fn a_mirror_being_written_is_not_read() {
    let mut f = InFlight::default();
    f.insert(4, &[], &[c(5, 9)]); // DRAM 9 being written
    let err = f.check(&[c(9, 1)], &[]).unwrap_err();
    assert_eq!(
        (err.tier, err.block, err.access),
        (Tier::Dram, 9, Access::Read)
    );
    assert_eq!(err.with_batch, Some(4));
}

#[test]
fn two_evictions_may_read_one_block() {
    let mut f = InFlight::default();
    f.insert(1, &[], &[c(5, 9)]);
    assert!(f.check(&[], &[c(5, 10)]).is_ok());
    f.insert(2, &[], &[c(5, 10)]);
    f.complete(1);
    assert!(f.is_busy(Tier::Hbm, 5), "batch 2 still reads it");
    assert_eq!(f.check(&[c(0, 5)], &[]).unwrap_err().with_batch, Some(2));
    f.complete(2);
    assert!(!f.is_busy(Tier::Hbm, 5));
    assert_eq!(f.batches(), 0);
}

#[test]
fn clashes_inside_one_batch_are_found() {
    let f = InFlight::default();
    // restore into HBM 5 while the same batch evicts HBM 5
    let err = f.check(&[c(1, 5)], &[c(5, 2)]).unwrap_err();
    assert_eq!(err.with_batch, None);
    // two restores into one block
    assert!(f.check(&[c(1, 5), c(2, 5)], &[]).is_err());
    // evict into the mirror that the same batch restores from
    assert!(f.check(&[c(3, 0)], &[c(4, 3)]).is_err());
}

#[test]
fn completing_an_unknown_batch_is_harmless() {
    let mut f = InFlight::default();
    f.insert(1, &[c(1, 2)], &[]);
    f.complete(99);
    assert!(f.is_busy(Tier::Hbm, 2));
    assert!(f.is_busy(Tier::Dram, 1));
}
