//! The contended chart (`contended.svg` next to the report): per backend
//! with a floor, horizontal bars of contended grants/s as a share of one
//! durable write per hand-off, with the limit (1.0x) and the target marked.
//! Plain SVG (sans-serif, a viewBox, no scripts) so GitHub and a browser
//! show it as it is.

use std::fmt::Write as _;

use crate::limit::{OneWrite, TARGET};
use crate::report::{Kind, thousands};

/// Series names, right-aligned against the plot.
const LABEL_W: f64 = 290.0;
const PLOT_W: f64 = 360.0;
/// Value labels, in their own column right of the plot.
const VALUE_W: f64 = 130.0;
const WIDTH: f64 = LABEL_W + PLOT_W + VALUE_W;
/// Title, legend and the marked lines' labels.
const TOP: f64 = 84.0;
const GROUP_HEAD: f64 = 20.0;
const BAR_STEP: f64 = 17.0;
const BAR_H: f64 = 12.0;
const GROUP_GAP: f64 = 10.0;
/// The axis ticks and its caption.
const BOTTOM: f64 = 40.0;
/// Shares past this are cut (a store without durable writes per grant can
/// be many times its limit) so the limit stays readable.
const MAX_AXIS: f64 = 2.0;

const LOCKER: &str = "#1d4ed8";
const TRAIT: &str = "#93c5fd";
const PEER: &str = "#9ca3af";
const LINE: &str = "#b91c1c";
const INK: &str = "#111827";
const MUTED: &str = "#6b7280";

/// The whole SVG document.
pub(crate) fn svg(all: &[OneWrite]) -> String {
    let bars: usize = all.iter().map(|w| w.bars.len()).sum();
    let plot_h = all.len() as f64 * (GROUP_HEAD + GROUP_GAP) + bars as f64 * BAR_STEP;
    let height = TOP + plot_h.max(BAR_STEP) + BOTTOM;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11" fill="{INK}">"#
    );
    let _ = writeln!(
        s,
        r##"<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let n = all
        .first()
        .map_or(String::new(), |w| format!("{}-way ", w.contenders));
    let _ = writeln!(
        s,
        r#"<text x="12" y="22" font-size="14" font-weight="bold">{n}contended grants/s as a share of one durable write per hand-off</text>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="12" y="40" fill="{MUTED}">Limit = 2 x the floor's cycles/s (two durable writes each), same run; past it = under one durable write per grant.</text>"#
    );
    legend(&mut s);
    if all.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="12" y="{}" fill="{MUTED}">No backend with a floor in this run.</text>"#,
            TOP + BAR_H
        );
        s.push_str("</svg>\n");
        return s;
    }
    let max_share = all
        .iter()
        .flat_map(|w| w.bars.iter().map(|b| w.share(b.per_sec)))
        .filter(|x| x.is_finite())
        .fold(1.0, f64::max);
    let axis = ((max_share * 4.0).ceil() / 4.0).clamp(1.25, MAX_AXIS);
    let x_of = |share: f64| LABEL_W + PLOT_W * (share.clamp(0.0, axis) / axis);
    let (top, bottom) = (TOP - 6.0, TOP + plot_h);
    axis_and_marks(&mut s, axis, max_share > axis, top, bottom, &x_of);
    let mut y = TOP;
    for w in all {
        let _ = writeln!(
            s,
            r#"<text x="12" y="{:.1}"><tspan font-weight="bold">{}</tspan><tspan dx="8" fill="{MUTED}">limit {}/s = 2 x floor {}/s</tspan></text>"#,
            y + 13.0,
            esc(&w.backend),
            thousands(w.limit()),
            thousands(w.floor_per_sec),
        );
        y += GROUP_HEAD;
        for b in &w.bars {
            let share = w.share(b.per_sec);
            let (fill, name) = match b.kind {
                Kind::Locker => (LOCKER, "distlock Locker".to_string()),
                Kind::Trait => (TRAIT, "distlock trait".to_string()),
                _ => (PEER, format!("peer: {}", b.label)),
            };
            let mid = y + BAR_H / 2.0 + 4.0;
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{mid:.1}" text-anchor="end">{}</text>"#,
                LABEL_W - 8.0,
                esc(&name)
            );
            let end = if share.is_finite() {
                x_of(share)
            } else {
                LABEL_W
            };
            let _ = writeln!(
                s,
                r#"<rect x="{LABEL_W}" y="{y:.1}" width="{:.1}" height="{BAR_H}" fill="{fill}" class="bar"/>"#,
                end - LABEL_W
            );
            if share > axis {
                // Cut: two white slashes near the end say "longer than shown".
                for dx in [14.0, 9.0] {
                    let _ = writeln!(
                        s,
                        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ffffff" stroke-width="2"/>"##,
                        end - dx - 3.0,
                        y + BAR_H + 1.0,
                        end - dx + 3.0,
                        y - 1.0
                    );
                }
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{mid:.1}">{}</text>"#,
                LABEL_W + PLOT_W + 10.0,
                if share.is_finite() {
                    format!("{share:.2}x · {}/s", thousands(b.per_sec))
                } else {
                    "-".into()
                }
            );
            y += BAR_STEP;
        }
        y += GROUP_GAP;
    }
    s.push_str("</svg>\n");
    s
}

/// What the colours and lines mean.
fn legend(s: &mut String) {
    let y = 52.0;
    let mut x = 12.0;
    for (fill, what) in [
        (LOCKER, "distlock Locker"),
        (TRAIT, "distlock trait"),
        (PEER, "peer (another library, same store)"),
    ] {
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{y}" width="10" height="10" fill="{fill}"/><text x="{:.1}" y="{}">{what}</text>"#,
            x + 14.0,
            y + 9.0
        );
        x += 26.0 + text_width(what);
    }
    for (dash, what) in [
        ("", "limit (1.0x)".to_string()),
        (
            r#" stroke-dasharray="4 3""#,
            format!("target ({TARGET:.1}x)"),
        ),
    ] {
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" y1="{}" x2="{:.1}" y2="{}" stroke="{LINE}" stroke-width="1.5"{dash}/><text x="{:.1}" y="{}">{what}</text>"#,
            y + 5.0,
            x + 16.0,
            y + 5.0,
            x + 20.0,
            y + 9.0
        );
        x += 34.0 + text_width(&what);
    }
}

/// Grid, ticks and the marked lines at the limit (1.0x) and the target.
fn axis_and_marks(
    s: &mut String,
    axis: f64,
    cut: bool,
    top: f64,
    bottom: f64,
    x_of: &dyn Fn(f64) -> f64,
) {
    let steps = (axis / 0.25).round() as u32;
    for i in 0..=steps {
        let share = f64::from(i) * 0.25;
        let x = x_of(share);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{bottom:.1}" stroke="#e5e7eb"/>"##
        );
        if i % 2 == 0 {
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="{MUTED}">{share:.1}x</text>"#,
                bottom + 14.0
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{MUTED}">share of the one-write limit{}</text>"#,
        LABEL_W + PLOT_W / 2.0,
        bottom + 30.0,
        if cut {
            format!(" (bars cut at {axis:.1}x)")
        } else {
            String::new()
        }
    );
    let (limit, target) = (x_of(1.0), x_of(TARGET));
    let _ = writeln!(
        s,
        r#"<line x1="{limit:.1}" y1="{top:.1}" x2="{limit:.1}" y2="{bottom:.1}" stroke="{LINE}" stroke-width="1.5" class="limit"/>"#
    );
    let _ = writeln!(
        s,
        r#"<line x1="{target:.1}" y1="{top:.1}" x2="{target:.1}" y2="{bottom:.1}" stroke="{LINE}" stroke-width="1.2" stroke-dasharray="4 3" class="target"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" fill="{LINE}">limit 1.0x</text>"#,
        limit + 4.0,
        top - 2.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" fill="{LINE}" text-anchor="end">target {TARGET:.1}x</text>"#,
        target - 4.0,
        top - 2.0
    );
}

/// About how wide `text` is at 11px sans-serif (for the legend's spacing).
fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * 6.2
}

/// Text as SVG character data.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Bar;

    fn backend(name: &str, floor: f64, rates: &[(Kind, &str, f64)]) -> OneWrite {
        OneWrite {
            backend: name.into(),
            contenders: 16,
            floor_per_sec: floor,
            bars: rates
                .iter()
                .map(|&(kind, label, per_sec)| Bar {
                    kind,
                    label: label.into(),
                    per_sec,
                })
                .collect(),
            p50: None,
            p99: None,
        }
    }

    /// Every element opened is closed in order (or closes itself).
    fn balanced(svg: &str) -> bool {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(at) = rest.find('<') {
            let end = at + rest[at..].find('>').expect("a tag ends");
            let tag = &rest[at + 1..end];
            rest = &rest[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                if open.pop() != Some(name.trim()) {
                    return false;
                }
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().unwrap_or(""));
            }
        }
        open.is_empty()
    }

    #[test]
    fn two_backends_give_their_bars_the_limit_and_the_target() {
        let all = [
            backend(
                "redis",
                2_000.0,
                &[
                    (Kind::Locker, "", 1_600.0),
                    (Kind::Trait, "", 1_500.0),
                    (Kind::Peer, "rslock <1 node> & retries", 1_800.0),
                ],
            ),
            // A peer with no durable write per grant: far past the limit.
            backend(
                "postgres",
                1_000.0,
                &[
                    (Kind::Locker, "", 1_000.0),
                    (Kind::Trait, "", 900.0),
                    (Kind::Peer, "blocking pg_advisory_lock", 9_000.0),
                ],
            ),
        ];
        let svg = svg(&all);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox="));
        assert!(balanced(&svg), "{svg}");
        assert_eq!(svg.matches(r#"class="bar""#).count(), 6, "{svg}");
        assert_eq!(svg.matches(r#"class="limit""#).count(), 1, "{svg}");
        assert_eq!(svg.matches(r#"class="target""#).count(), 1, "{svg}");
        assert!(svg.contains("0.40x · 1,600/s"), "{svg}");
        assert!(svg.contains("4.50x · 9,000/s"), "{svg}");
        assert!(svg.contains("limit 4,000/s = 2 x floor 2,000/s"), "{svg}");
        assert!(
            svg.contains("peer: rslock &lt;1 node&gt; &amp; retries"),
            "{svg}"
        );
        assert!(!svg.contains("<script"), "{svg}");
        assert!(svg.contains(">16-way contended grants/s"), "{svg}");
        // The limit is at 1.0x of an axis cut at 2.0x: the plot's middle.
        let limit_x = LABEL_W + PLOT_W / 2.0;
        assert!(
            svg.contains(&format!(r#"<line x1="{limit_x:.1}" y1="78.0""#)),
            "{svg}"
        );
    }

    #[test]
    fn no_backend_with_a_floor_still_gives_a_document() {
        let svg = svg(&[]);
        assert!(balanced(&svg), "{svg}");
        assert!(svg.contains("No backend with a floor"), "{svg}");
        assert!(svg.contains(">contended grants/s"), "{svg}");
    }

    #[test]
    fn a_zero_floor_gives_no_bar_past_the_plot() {
        let svg = svg(&[backend("odd", 0.0, &[(Kind::Locker, "", 10.0)])]);
        assert!(balanced(&svg), "{svg}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }
}
