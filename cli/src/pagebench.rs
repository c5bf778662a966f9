//! `strata pagebench`: GetPage@LSN load against a pageserver.

use clap::Args;

#[derive(Args, Debug)]
pub struct PagebenchArgs {}

pub fn run(args: PagebenchArgs) -> i32 {
    let _ = args;
    eprintln!("strata pagebench: not built yet");
    1
}
