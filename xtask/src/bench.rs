//! `cargo xtask bench`: XDP router against kernel forwarding.

pub fn run(quick: bool) -> Result<(), String> {
    let mode = if quick { " --quick" } else { "" };
    Err(format!("bench{mode}: not yet implemented"))
}
