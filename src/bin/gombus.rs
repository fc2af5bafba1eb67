//! The `gombus` command line (see `gombus --help` and `gombus::cli`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    ExitCode::from(gombus::cli::run(&args))
}
