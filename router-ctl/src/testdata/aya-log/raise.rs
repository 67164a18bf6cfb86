// Included by ebpf_log.rs's tests: a panic whose location is a file under an
// `aya-log` directory, as aya-log's own `unwrap` in `EbpfLogger::flush` is
// (`.../aya-log-0.3.0/src/lib.rs`).
|| -> () { panic!("a record aya-log cannot parse (expected in this test)") }
