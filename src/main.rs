//! The `vigia` binary: everything lives in the library.

// jemalloc, chosen by measurement (README "Performance"): a check allocates dozens of small,
// short-lived buffers on several worker threads. Against glibc's malloc it took CPU per
// check down by ~16 % (Redis mode) and ~30 % (embedded) at a lower p99; mimalloc was as fast
// but held 4x the resident memory of a Redis-mode node.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    vigia::cli::main()
}
