import gc

from voicert.telemetry.gcwatch import GcWatch, settle
from voicert.telemetry.metrics import Metrics


def test_watch_times_each_collection_and_metrics_export_them():
    watch = GcWatch().install()
    try:
        gc.collect(0)
        gc.collect(2)
        pauses = watch.drain()
    finally:
        watch.remove()
    assert [p.generation for p in pauses][-2:] == [0, 2]
    assert all(p.seconds >= 0 for p in pauses)
    gc.collect()
    assert watch.drain() == []  # removed: records nothing more
    m = Metrics()
    m.observe_gc("engine", pauses)
    assert b'voicert_gc_pause_seconds_count{generation="2",process="engine"}' in m.exposition()


def test_settle_freezes_what_is_loaded_so_full_collections_skip_it():
    keep = [[i] for i in range(200_000)]  # a loaded model's worth of tracked objects
    try:
        frozen = settle()
        # Frozen objects can still die by refcount (a finished thread's frame, say), so the
        # count may only fall after settle returns; what we keep must stay frozen.
        assert frozen >= len(keep) and len(keep) <= gc.get_freeze_count() <= frozen
        walked = {id(o) for o in gc.get_objects()}  # what a full collection still walks
        assert len(walked) < frozen
        assert not any(id(row) in walked for row in keep)
    finally:
        gc.unfreeze()
    del keep
