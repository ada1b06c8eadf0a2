"""asv benchmark suites of kdengine (thin: the measuring lives in kdengine.bench)."""
