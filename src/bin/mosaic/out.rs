//! Standard output for the CLI's answers.
//!
//! Rust ignores SIGPIPE, so `println!` panics when the reader has gone away
//! (`mosaic status | head -1`). A command's answer is printed here instead: a closed pipe
//! drops the rest of the output quietly and the command's own exit code stands (the
//! request it made has already been decided, and the reader chose to stop reading). Any
//! other write failure (a full disk under `> file`, EIO) is an error: the command fails
//! with it, so a truncated answer never exits 0. The binary's daemons never print here:
//! SIGPIPE stays ignored for them.

use std::io::Write;

/// Prints one line of a command's answer.
pub(crate) fn line(args: std::fmt::Arguments) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    let written = o
        .write_fmt(args)
        .and_then(|()| o.write_all(b"\n"))
        .and_then(|()| o.flush());
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(anyhow::Error::new(e).context("writing the answer to stdout")),
    }
}
