//! Standard output for the CLI's answers.
//!
//! Rust ignores SIGPIPE, so `println!` panics when the reader has gone away
//! (`mosaic status | head -1`). A command's answer is printed here instead: a closed pipe
//! drops the rest of the output quietly and the command's own exit code stands (the
//! request it made has already been decided); any other write failure is reported on
//! stderr. The binary's daemons never print here: SIGPIPE stays ignored for them.

use std::io::Write;

/// Prints one line of a command's answer.
pub(crate) fn line(args: std::fmt::Arguments) {
    let mut o = std::io::stdout().lock();
    let written = o
        .write_fmt(args)
        .and_then(|()| o.write_all(b"\n"))
        .and_then(|()| o.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "mosaic: writing the answer to stdout: {e}"
            );
        }
    }
}
