//! The platform section's figures, as router reviews print them: CPU,
//! cores, memory, kernel, NIC driver, and the machine's crypto throughput
//! (`openssl speed -evp chacha20-poly1305`, the figure soft-router buyers
//! compare for VPN use).

use std::process::Command;

use tests::{LAN_IF, Ns, Topology};

/// The block sizes `openssl speed` measures by default, which are the ones
/// reviews list.
pub const CRYPTO_SIZES: [u32; 6] = [16, 64, 256, 1024, 8192, 16384];

/// `openssl speed -mr` output: bytes per second per block size, from its
/// `+F:...:ChaCha20-Poly1305:v16:v64:...` line.
pub fn parse_openssl_speed(text: &str) -> Vec<(u32, f64)> {
    let Some(line) = text.lines().find(|l| l.starts_with("+F:")) else {
        return Vec::new();
    };
    let sizes: Vec<u32> = text
        .lines()
        .find_map(|l| l.strip_prefix("+H:"))
        .map_or_else(
            || CRYPTO_SIZES.to_vec(),
            |h| h.split(':').filter_map(|x| x.parse().ok()).collect(),
        );
    // +F:<n>:<name>:<rate per size>...
    let rates = line
        .split(':')
        .skip(3)
        .filter_map(|x| x.parse::<f64>().ok());
    sizes.into_iter().zip(rates).collect()
}

/// How long the crypto figure takes: `secs` per block size, on every size
/// or (smoke runs) only the smallest.
#[derive(Clone, Copy)]
pub struct CryptoRun {
    pub secs: u32,
    pub all_sizes: bool,
}

/// ChaCha20-Poly1305 throughput in bytes per second per block size; the
/// reason when openssl fails.
fn chacha20_poly1305(c: CryptoRun) -> Result<Vec<(u32, f64)>, String> {
    let mut cmd = Command::new("timeout");
    cmd.args([
        "-k",
        "5",
        &(c.secs * 6 + 30).to_string(),
        "openssl",
        "speed",
        "-mr",
    ])
    .args(["-seconds", &c.secs.to_string(), "-evp", "chacha20-poly1305"]);
    if !c.all_sizes {
        cmd.args(["-bytes", &CRYPTO_SIZES[0].to_string()]);
    }
    let out = cmd.output().map_err(|e| format!("openssl: {e}"))?;
    let rates = parse_openssl_speed(&String::from_utf8_lossy(&out.stdout));
    if rates.is_empty() {
        return Err(format!(
            "openssl speed: no result ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(rates)
}

/// The router's NIC: driver and version as `ethtool -i` reports them.
fn nic(t: &Topology) -> String {
    let o = t.exec(Ns::Router, &["ethtool", "-i", LAN_IF]);
    let text = String::from_utf8_lossy(&o.stdout);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    format!(
        "{} {} (virtual Ethernet pair; no physical NIC)",
        field("driver:"),
        field("version:")
    )
}

/// The platform: [`crate::measure::sys::machine`] plus NIC and crypto.
pub fn platform(t: &Topology, crypto: CryptoRun) -> serde_json::Value {
    let mut v = crate::measure::sys::machine();
    v["nic"] = nic(t).into();
    v["openssl"] = Command::new("openssl")
        .arg("version")
        .output()
        .map_or_else(
            |e| format!("openssl: {e}"),
            |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
        .into();
    match chacha20_poly1305(crypto) {
        Ok(rates) => {
            v["chacha20_poly1305_bytes_per_s"] = rates
                .iter()
                .map(|(size, r)| serde_json::json!({"block_bytes": size, "bytes_per_s": r}))
                .collect();
        }
        Err(e) => v["chacha20_poly1305_error"] = e.into(),
    }
    v
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn openssl_machine_readable_output() {
        let text = "+DT:ChaCha20-Poly1305:1:16\n+H:16:64:256:1024:8192:16384\n\
                    +F:25:ChaCha20-Poly1305:189617039.18:405941074.75:988068096.00:\
                    1808618057.14:2020605952.00:1988771840.00\n";
        let r = parse_openssl_speed(text);
        assert_eq!(r.len(), 6);
        assert_eq!(r[0].0, 16);
        assert!((r[5].1 - 1_988_771_840.0).abs() < 1.0);
        assert!(parse_openssl_speed("nothing").is_empty());
    }
}
