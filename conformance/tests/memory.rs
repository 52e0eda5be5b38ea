//! The whole suite against the reference backend.

lock_conformance::suite!(lock_conformance::shared(lockcore::MemoryBackend::new()));
