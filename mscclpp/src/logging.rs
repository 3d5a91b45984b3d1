//! Logging set-up for binaries and the C library (the library crates only emit `tracing` events).

/// Installs a `tracing` subscriber writing to standard error, filtered by `MSCCLPP_LOG_LEVEL`
/// (or `MSCCLPP_DEBUG`), else by `RUST_LOG`, else `warn`. Safe to call more than once.
///
/// A malformed level is reported once on standard error and `warn` is used: logging set-up must
/// not stop a job. Colour codes are written only when standard error is a terminal (and
/// `NO_COLOR` is unset): logs of launched ranks go to files and pipes, where they are noise.
pub fn init_logging() {
    let directive = match mscclpp_hal::env::log_filter() {
        Ok(Some(level)) => level,
        Ok(None) => std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        Err(e) => {
            eprintln!("mscclpp: {e}; logging at warn");
            "warn".into()
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directive)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(use_colour())
        .try_init();
}

fn use_colour() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stderr().is_terminal()
}
