//! The fake harness binary; see `mosaic::fake_harness`.
fn main() {
    std::process::exit(mosaic::fake_harness::run(
        std::env::args().skip(1).collect(),
    ));
}
