//! Resizing I420 pictures by area: each destination pixel is the mean of the source area it
//! covers, partly covered source pixels weighted by how much of them it covers (a box filter, what
//! a downscale wants: no aliasing from skipped pixels, no blur wider than the step). Pure: no I/O,
//! integer arithmetic only, so the same picture always gives the same bytes. A camera's proxy
//! ([`crate::proxy`]) scales every captured picture with it.

/// One axis of a resize from `src` to `dst` samples: for each destination sample, the first
/// source sample it covers and the weights of the ones it covers from there. A source sample is
/// `dst` units wide and a destination sample `src` units, so the weights of one destination
/// sample sum to `src` and every weight is a whole number.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Axis {
    src: u32,
    /// Per destination sample: (first source sample, offset of its weights in `weights`, count).
    taps: Vec<(u32, u32, u32)>,
    weights: Vec<u32>,
}

impl Axis {
    fn new(src: usize, dst: usize) -> Axis {
        let (s, d) = (src as u64, dst as u64);
        let mut taps = Vec::with_capacity(dst);
        let mut weights = Vec::new();
        for i in 0..d {
            let (lo, hi) = (i * s, (i + 1) * s);
            let (first, last) = (lo / d, (hi - 1) / d);
            let at = weights.len() as u32;
            for j in first..=last {
                weights.push((hi.min((j + 1) * d) - lo.max(j * d)) as u32);
            }
            taps.push((first as u32, at, (last - first + 1) as u32));
        }
        Axis {
            src: src as u32,
            taps,
            weights,
        }
    }

    fn tap(&self, i: usize) -> (usize, &[u32]) {
        let (first, at, n) = self.taps[i];
        (
            first as usize,
            &self.weights[at as usize..(at + n) as usize],
        )
    }
}

/// One plane's resize: both axes and the row it sums into.
#[derive(Debug, Clone)]
struct PlaneScaler {
    width: usize,
    cols: Axis,
    rows: Axis,
    /// The weighted sum of the source rows one destination row covers (down first: a plain
    /// multiply-add along whole rows, then across once per destination row).
    down: Vec<u32>,
}

impl PlaneScaler {
    fn new(src: (usize, usize), dst: (usize, usize)) -> Self {
        PlaneScaler {
            width: src.0,
            cols: Axis::new(src.0, dst.0),
            rows: Axis::new(src.1, dst.1),
            down: vec![0; src.0],
        }
    }

    /// Resizes `src` (tight rows of `width`) and appends the destination plane to `out`. Exact:
    /// each destination pixel is its area's weighted sum over the whole weight, rounded once.
    fn scale(&mut self, src: &[u8], out: &mut Vec<u8>) {
        let whole = u64::from(self.cols.src) * u64::from(self.rows.src);
        for r in 0..self.rows.taps.len() {
            let (first_row, row_weights) = self.rows.tap(r);
            self.down.iter_mut().for_each(|s| *s = 0);
            for (k, &wy) in row_weights.iter().enumerate() {
                let row = &src[(first_row + k) * self.width..][..self.width];
                for (d, &p) in self.down.iter_mut().zip(row) {
                    *d += wy * u32::from(p);
                }
            }
            for i in 0..self.cols.taps.len() {
                let (first, weights) = self.cols.tap(i);
                let acc: u64 = weights
                    .iter()
                    .zip(&self.down[first..])
                    .map(|(&w, &d)| u64::from(w) * u64::from(d))
                    .sum();
                out.push(((acc + whole / 2) / whole) as u8);
            }
        }
    }
}

/// Resizes I420 pictures of one size to another (both even), by area ([the module](self)).
/// Built once per pair of sizes: the weights are computed here, not per picture.
#[derive(Debug, Clone)]
pub struct Scaler {
    src: (usize, usize),
    dst: (usize, usize),
    luma: PlaneScaler,
    chroma: PlaneScaler,
}

/// A size a [`Scaler`] cannot take: zero, odd (4:2:0 halves both), or above 16384.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot scale I420 {src_w}x{src_h} to {dst_w}x{dst_h} (sizes even, 2 to 16384)")]
pub struct BadSize {
    pub src_w: usize,
    pub src_h: usize,
    pub dst_w: usize,
    pub dst_h: usize,
}

impl Scaler {
    pub fn new(src: (usize, usize), dst: (usize, usize)) -> Result<Scaler, BadSize> {
        let ok = |v: usize| (2..=16_384).contains(&v) && v % 2 == 0;
        if !(ok(src.0) && ok(src.1) && ok(dst.0) && ok(dst.1)) {
            return Err(BadSize {
                src_w: src.0,
                src_h: src.1,
                dst_w: dst.0,
                dst_h: dst.1,
            });
        }
        Ok(Scaler {
            src,
            dst,
            luma: PlaneScaler::new(src, dst),
            chroma: PlaneScaler::new((src.0 / 2, src.1 / 2), (dst.0 / 2, dst.1 / 2)),
        })
    }

    /// The source size this scaler takes.
    pub fn source(&self) -> (usize, usize) {
        self.src
    }

    /// The size it makes.
    pub fn target(&self) -> (usize, usize) {
        self.dst
    }

    /// Resizes one picture (planes Y, U, V, tight rows) into `out` (cleared first: Y, U, V of the
    /// target size, tight). Planes shorter than the source size are refused.
    pub fn scale(
        &mut self,
        planes: (&[u8], &[u8], &[u8]),
        out: &mut Vec<u8>,
    ) -> Result<(), BadSize> {
        let (w, h) = self.src;
        let c = (w / 2) * (h / 2);
        if planes.0.len() < w * h || planes.1.len() < c || planes.2.len() < c {
            return Err(BadSize {
                src_w: w,
                src_h: h,
                dst_w: self.dst.0,
                dst_h: self.dst.1,
            });
        }
        out.clear();
        out.reserve(self.dst.0 * self.dst.1 * 3 / 2);
        self.luma.scale(planes.0, out);
        self.chroma.scale(planes.1, out);
        self.chroma.scale(planes.2, out);
        Ok(())
    }
}

/// The planes of a tight I420 picture of `width` x `height` held in `i420`.
pub fn planes(i420: &[u8], width: usize, height: usize) -> (&[u8], &[u8], &[u8]) {
    let (y, chroma) = i420.split_at((width * height).min(i420.len()));
    let (u, v) = chroma.split_at(((width / 2) * (height / 2)).min(chroma.len()));
    (y, u, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picture(w: usize, h: usize, f: impl Fn(usize, usize, usize) -> u8) -> Vec<u8> {
        let mut p = Vec::new();
        for (plane, (pw, ph)) in [(0, (w, h)), (1, (w / 2, h / 2)), (2, (w / 2, h / 2))] {
            for y in 0..ph {
                for x in 0..pw {
                    p.push(f(plane, x, y));
                }
            }
        }
        p
    }

    fn scale(src: &[u8], from: (usize, usize), to: (usize, usize)) -> Vec<u8> {
        let mut s = Scaler::new(from, to).unwrap();
        let mut out = Vec::new();
        s.scale(planes(src, from.0, from.1), &mut out).unwrap();
        assert_eq!(out.len(), to.0 * to.1 * 3 / 2);
        out
    }

    #[test]
    fn the_weights_of_each_destination_sample_cover_its_source_area() {
        let a = Axis::new(5, 2);
        // Each destination sample covers 2.5 source samples: 2 + 1/2, then 1/2 + 2.
        assert_eq!(a.tap(0), (0, &[2, 2, 1][..]));
        assert_eq!(a.tap(1), (2, &[1, 2, 2][..]));
        for (src, dst) in [(1920, 854), (1280, 320), (360, 180), (7, 7), (3, 5)] {
            let a = Axis::new(src, dst);
            for i in 0..dst {
                assert_eq!(
                    a.tap(i).1.iter().sum::<u32>(),
                    src as u32,
                    "{src}->{dst} #{i}"
                );
            }
            // Every source sample is covered in full, once.
            let mut cover = vec![0u32; src];
            for i in 0..dst {
                let (first, w) = a.tap(i);
                for (k, w) in w.iter().enumerate() {
                    cover[first + k] += w;
                }
            }
            assert!(cover.iter().all(|c| *c == dst as u32), "{src}->{dst}");
        }
    }

    #[test]
    fn a_flat_picture_stays_flat_and_the_same_size_is_the_identity() {
        let flat = picture(64, 36, |p, _, _| [16, 128, 200][p]);
        let small = scale(&flat, (64, 36), (22, 12));
        assert_eq!(small, picture(22, 12, |p, _, _| [16, 128, 200][p]));
        let noise = picture(40, 30, |p, x, y| ((x * 37 + y * 101 + p * 7) % 251) as u8);
        assert_eq!(scale(&noise, (40, 30), (40, 30)), noise);
    }

    #[test]
    fn halving_averages_each_two_by_two_block_rounded() {
        let src = picture(8, 4, |p, x, y| (x * 10 + y * 3 + p) as u8);
        let out = scale(&src, (8, 4), (4, 2));
        let want = picture(4, 2, |p, x, y| {
            // Mean of x*10 over 2x, 2x+1 is 20x + 5; of y*3 over 2y, 2y+1 is 6y + 1.5.
            let mean = 20.0 * x as f64 + 5.0 + 6.0 * y as f64 + 1.5 + p as f64;
            (mean + 0.5).floor() as u8
        });
        assert_eq!(out, want);
    }

    #[test]
    fn a_fractional_step_weights_the_parts_it_covers() {
        // 6 to 4 across: each covers 1.5 source pixels, so [0, 90, 180] gives
        // (0 + 90 / 2) / 1.5 = 30 and (90 / 2 + 180) / 1.5 = 150.
        let src = picture(
            6,
            2,
            |p, x, _| if p == 0 { [0u8, 90, 180][x % 3] } else { 77 },
        );
        let out = scale(&src, (6, 2), (4, 2));
        assert_eq!(&out[..8], &[30, 150, 30, 150, 30, 150, 30, 150]);
        assert_eq!(&out[8..], &[77, 77, 77, 77]);
    }

    #[test]
    fn the_mean_of_a_textured_picture_is_kept_and_bad_sizes_are_refused() {
        let src = picture(1280, 720, |p, x, y| {
            ((x * x / 7 + y * 13 + p * 50) % 256) as u8
        });
        let out = scale(&src, (1280, 720), (854, 480));
        let mean = |v: &[u8]| v.iter().map(|b| *b as f64).sum::<f64>() / v.len() as f64;
        let (a, b) = (mean(&src[..1280 * 720]), mean(&out[..854 * 480]));
        assert!((a - b).abs() < 0.5, "{a} vs {b}");
        assert!(Scaler::new((1280, 720), (853, 480)).is_err());
        assert!(Scaler::new((0, 720), (320, 180)).is_err());
        let mut s = Scaler::new((64, 36), (32, 18)).unwrap();
        let mut out = Vec::new();
        assert!(s
            .scale((&src[..10], &src[..10], &src[..10]), &mut out)
            .is_err());
    }

    /// What scaling costs a proxy per picture: 1080p to 854x480 and 720p to 320x180.
    /// `cargo test --release --locked -p rigd-drivers --lib -- --ignored --nocapture bench_scale`
    #[test]
    #[ignore = "benchmark"]
    fn bench_scale() {
        for (from, to) in [((1920, 1080), (854, 480)), ((1280, 720), (320, 180))] {
            let src = picture(from.0, from.1, |p, x, y| ((x * 7 + y * 3 + p) % 256) as u8);
            let mut s = Scaler::new(from, to).unwrap();
            let mut out = Vec::new();
            let rounds = 50;
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                s.scale(planes(&src, from.0, from.1), &mut out).unwrap();
            }
            let ms = t.elapsed().as_secs_f64() * 1e3 / rounds as f64;
            println!(
                "scale {}x{} -> {}x{}: {ms:.2} ms",
                from.0, from.1, to.0, to.1
            );
        }
    }
}
