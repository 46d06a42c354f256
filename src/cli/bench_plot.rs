//! HDR-style latency percentile plots as standalone SVG (`hasync bench sync --plot FILE`):
//! the x axis is the percentile on a log scale of 1 / (1 - p) (0 %, 90 %, 99 %, 99.9 %, ...),
//! the y axis the latency in microseconds on a log scale, one line per series, a legend.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 340.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
/// Nines on the x axis: up to 99.999 %.
const MAX_NINES: f64 = 5.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#bcbd22", "#7f7f7f",
];

/// The x position of percentile `p` (0..1): log10(1 / (1 - p)) nines, capped at the axis.
pub(crate) fn x_of(p: f64) -> f64 {
    let nines = if p >= 1.0 { MAX_NINES } else { (1.0 / (1.0 - p)).log10().min(MAX_NINES) };
    LEFT + (WIDTH - LEFT - RIGHT) * nines.max(0.0) / MAX_NINES
}

/// The y position of `us` microseconds on a log axis from `lo` to `hi` (powers of ten).
pub(crate) fn y_of(us: f64, lo: f64, hi: f64) -> f64 {
    let v = us.max(lo).min(hi);
    let f = (v.log10() - lo.log10()) / (hi.log10() - lo.log10());
    HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * f
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The points of one series: the latency at percentiles spaced evenly in nines.
fn points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    (0..=100)
        .map(|i| {
            let nines = MAX_NINES * f64::from(i) / 100.0;
            let p = 1.0 - 10f64.powf(-nines);
            (p, h.value_at_quantile(p).max(1) as f64)
        })
        .collect()
}

/// The plot of `series` (label, histogram of microseconds) under `title`.
pub(crate) fn svg(title: &str, series: &[(&str, &Histogram<u64>)]) -> String {
    let max = series.iter().map(|(_, h)| h.max()).max().unwrap_or(1).max(10) as f64;
    let min = series.iter().map(|(_, h)| h.min()).min().unwrap_or(1).max(1) as f64;
    let (lo, hi) = (10f64.powf(min.log10().floor()), 10f64.powf(max.log10().ceil()));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{LEFT}" y="24" font-size="14">{}</text>"#, escape(title));
    // Axes, grid and ticks.
    let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM);
    let _ = writeln!(
        s,
        r#"<rect x="{x0}" y="{y0}" width="{}" height="{}" fill="none" stroke="black"/>"#,
        x1 - x0,
        y1 - y0
    );
    for n in 0..=MAX_NINES as u32 {
        let p = 1.0 - 10f64.powi(-(n as i32));
        let x = x_of(p);
        let label = match n {
            0 => "0%".to_owned(),
            _ => format!("{}%", 100.0 - 100.0 * 10f64.powi(-(n as i32))),
        };
        let _ =
            writeln!(s, r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{y1}" stroke="#ddd"/>"##);
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{label}</text>"#,
            y1 + 18.0
        );
    }
    let mut decade = lo;
    while decade <= hi * 1.0001 {
        let y = y_of(decade, lo, hi);
        let _ =
            writeln!(s, r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#ddd"/>"##);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{decade}</text>"#,
            x0 - 6.0,
            y + 4.0
        );
        decade *= 10.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">percentile</text>"#,
        (x0 + x1) / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">latency (microseconds, log scale)</text>"#,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0
    );
    // One line per series, and the legend.
    for (i, (label, h)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = points(h)
            .iter()
            .map(|&(p, us)| format!("{:.1},{:.1}", x_of(p), y_of(us, lo, hi)))
            .collect();
        let dash = if label.starts_with("Redis") { r#" stroke-dasharray="6 3""# } else { "" };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/>"#,
            x1 + 12.0,
            x1 + 36.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{} (p50 {} us)</text>"#,
            x1 + 42.0,
            ly + 4.0,
            escape(label),
            h.value_at_quantile(0.5)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for &v in values {
            h.record(v).unwrap();
        }
        h
    }

    #[test]
    fn percentiles_map_to_nines_and_latency_to_a_log_axis() {
        let step = (WIDTH - LEFT - RIGHT) / MAX_NINES;
        assert!((x_of(0.0) - LEFT).abs() < 1e-9);
        assert!((x_of(0.9) - (LEFT + step)).abs() < 1e-6);
        assert!((x_of(0.999) - (LEFT + 3.0 * step)).abs() < 1e-6);
        assert!((x_of(1.0) - (WIDTH - RIGHT)).abs() < 1e-9, "100% is the right edge");
        assert!((y_of(10.0, 10.0, 1000.0) - (HEIGHT - BOTTOM)).abs() < 1e-9);
        assert!((y_of(1000.0, 10.0, 1000.0) - TOP).abs() < 1e-9);
        let mid = y_of(100.0, 10.0, 1000.0);
        assert!((mid - (TOP + HEIGHT - BOTTOM) / 2.0).abs() < 1e-6, "100 is halfway: {mid}");
        assert!(y_of(1.0, 10.0, 1000.0) == HEIGHT - BOTTOM, "clamped below");
    }

    #[test]
    fn every_series_is_drawn_and_named_and_the_svg_is_well_formed() {
        let a = hist(&[50, 60, 70, 80, 5000]);
        let b = hist(&[20, 30, 40]);
        let out = svg(
            "t <&> \"q\"",
            &[("hasync SYNC Put 1 clients", &a), ("Redis SET+WAIT 1 clients", &b)],
        );
        assert!(out.starts_with("<svg") && out.ends_with("</svg>\n"));
        assert_eq!(out.matches("<polyline").count(), 2);
        assert!(
            out.contains("hasync SYNC Put 1 clients") && out.contains("Redis SET+WAIT 1 clients")
        );
        assert!(out.contains("t &lt;&amp;&gt; &quot;q&quot;"), "the title is escaped");
        assert!(!out.contains("NaN") && !out.contains("inf"));
        // Every element opened is closed: self-closing or with its end tag.
        for tag in ["text", "svg"] {
            assert_eq!(
                out.matches(&format!("<{tag} ")).count(),
                out.matches(&format!("</{tag}>")).count(),
                "{tag}"
            );
        }
        for tag in ["line", "rect", "polyline"] {
            let opened = out.matches(&format!("<{tag} ")).count();
            assert!(opened > 0);
            assert_eq!(
                out.lines()
                    .filter(|l| l.starts_with(&format!("<{tag} ")) && l.ends_with("/>"))
                    .count(),
                opened,
                "{tag}"
            );
        }
    }

    #[test]
    fn an_empty_plot_has_axes_and_no_nan() {
        let out = svg("empty", &[]);
        assert!(out.contains("percentile") && !out.contains("NaN"));
    }
}
