//! The `hasync` binary: parse the command line and dispatch to [`hasync::cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    hasync::cli::main()
}
