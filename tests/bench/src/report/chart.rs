//! throughput.svg: throughput against connections, one panel per workload
//! variant, both paths in each.

use std::path::Path;

use plotters::prelude::*;

use crate::model::{DataPath, RunResult, Workload};
use crate::report::tables::{conns_of, find, thr, variants};

/// Throughput against connections, one panel per workload variant, both
/// paths in each.
pub fn chart(runs: &[RunResult], path: &Path) -> Result<(), String> {
    let vs = variants(runs);
    if vs.is_empty() {
        return Err("no runs to chart".into());
    }
    let cols = if vs.len() > 1 { 2 } else { 1 };
    let rows = vs.len().div_ceil(cols);
    let (w, h) = (560 * cols as u32, 40 + 340 * rows as u32);
    let root = SVGBackend::new(path, (w, h)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            "Throughput vs connections: kernel (iptables MASQUERADE) vs XDP",
            ("sans-serif", 22),
        )
        .map_err(|x| e(&x))?;
    let panels = root.split_evenly((rows, cols));
    let kernel_style = RGBColor(0xd6, 0x27, 0x28);
    let xdp_style = RGBColor(0x1f, 0x77, 0xb4);
    for (area, v) in panels.iter().zip(&vs) {
        let conns = conns_of(runs, *v);
        let x_max = f64::from(*conns.last().unwrap_or(&1)) * 1.5;
        let series: Vec<(DataPath, Vec<(f64, f64)>)> = [DataPath::Kernel, DataPath::Xdp]
            .into_iter()
            .map(|p| {
                let pts = conns
                    .iter()
                    .filter_map(|&c| find(runs, *v, c, p).map(|r| (f64::from(c), thr(r))))
                    .collect();
                (p, pts)
            })
            .collect();
        let y_max = series
            .iter()
            .flat_map(|(_, s)| s.iter().map(|p| p.1))
            .filter(|y| y.is_finite())
            .fold(0.0_f64, f64::max)
            .max(1e-3)
            * 1.35;
        let unit = if v.workload.is_udp() {
            "Mpps received"
        } else {
            "Gbit/s"
        };
        let mut chart = ChartBuilder::on(area)
            .caption(v.short(), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d((0.7_f64..x_max).log_scale(), 0.0..y_max)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc(if v.workload == Workload::UdpLive {
                "flows (in-kernel generator)"
            } else {
                "connections (iperf -P)"
            })
            .y_desc(unit)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(|x| e(&x))?;
        for (p, pts) in series {
            let color = if p == DataPath::Kernel {
                kernel_style
            } else {
                xdp_style
            };
            let pts: Vec<(f64, f64)> = pts.into_iter().filter(|p| p.1.is_finite()).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(p.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            chart
                .draw_series(
                    pts.iter()
                        .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                )
                .map_err(|x| e(&x))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
