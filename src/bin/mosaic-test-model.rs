//! The deterministic model endpoint for harness tests; see `mosaic::testmodel`.
//! Usage: mosaic-test-model --log FILE [--listen 127.0.0.1:0]
fn main() {
    let mut args = std::env::args().skip(1);
    let (mut listen, mut log) = ("127.0.0.1:0".to_string(), None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or(listen),
            "--log" => log = args.next(),
            _ => {
                eprintln!("usage: mosaic-test-model --log FILE [--listen ADDR]");
                std::process::exit(2);
            }
        }
    }
    let Some(log) = log else {
        eprintln!("usage: mosaic-test-model --log FILE [--listen ADDR]");
        std::process::exit(2);
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mosaic-test-model: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(mosaic::testmodel::serve(&listen, log.into())) {
        eprintln!("mosaic-test-model: {e}");
        std::process::exit(1);
    }
}
