//! The first process of every generation; see `mosaic::shim`.
fn main() {
    std::process::exit(mosaic::shim::main(std::env::args_os().skip(1)));
}
