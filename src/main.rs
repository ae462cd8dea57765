//! The `vigia` binary: everything lives in the library.

fn main() -> std::process::ExitCode {
    vigia::cli::main()
}
