//! The `gombus` command line (see `gombus --help` and `gombus::cli`).

use std::process::ExitCode;

const SIGPIPE: i32 = 13;
const SIG_DFL: usize = 0;

extern "C" {
    /// `sighandler_t signal(int signum, sighandler_t handler)`.
    fn signal(signum: i32, handler: usize) -> usize;
}

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of our
    // output goes away (`gombus sub '>' | head`) instead of panicking on
    // a failed print.
    // SAFETY: restoring the default disposition of a signal.
    unsafe {
        signal(SIGPIPE, SIG_DFL);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    ExitCode::from(gombus::cli::run(&args))
}
