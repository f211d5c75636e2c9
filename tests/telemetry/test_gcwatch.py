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
        assert frozen >= len(keep) and gc.get_freeze_count() == frozen
        tracked = len(gc.get_objects())
        assert tracked < frozen  # what a full collection still walks
    finally:
        gc.unfreeze()
    del keep
