//! What the synthetic video camera films: a slow pan across a textured still, with sensor noise,
//! as planar YUV 4:2:0 (I420). Pure: no I/O, deterministic for a size.
//!
//! The still is generated once (1/f value noise, the spectrum of natural images, with hard-edged
//! shapes over it), larger than the frame; each frame is the window the pan has reached plus fresh
//! noise in every pixel. An encoder has real work: texture at every scale, edges, motion, and noise
//! that no prediction removes. A flat gradient, as the MJPEG camera draws, compresses to nothing
//! and flatters every codec.

/// Horizontal pan speed in pixels per frame, and the vertical sway's amplitude in pixels.
const PAN_STEP: usize = 4;
const SWAY: usize = 24;
/// Sensor noise: each luma sample moves by up to this much either way (triangular distribution).
const NOISE: i32 = 3;

/// A textured still and the frame buffers a pan across it is drawn into.
pub struct Pan {
    width: usize,
    height: usize,
    /// The still: luma at full size, chroma at half, `tex_w` x `tex_h` luma samples.
    tex_w: usize,
    tex_h: usize,
    tex_y: Vec<u8>,
    tex_u: Vec<u8>,
    tex_v: Vec<u8>,
    y: Vec<u8>,
    u: Vec<u8>,
    v: Vec<u8>,
    noise: u64,
    /// The noise's amplitude: [`NOISE`], or 0 for the clean scene ([`Pan::without_noise`]).
    noise_amp: i32,
}

impl std::fmt::Debug for Pan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pan({}x{})", self.width, self.height)
    }
}

/// xorshift64*: fast, deterministic, good enough for texture and noise.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// Value noise: a lattice of random values every `cell` samples, interpolated smoothly, summed
/// over octaves with amplitude halving as the cell halves (1/f), scaled to 0..=255.
fn fractal(w: usize, h: usize, largest_cell: usize, octaves: u32, seed: u64) -> Vec<f32> {
    let mut out = vec![0f32; w * h];
    let mut state = seed | 1;
    let mut cell = largest_cell.max(2);
    let mut amp = 1f32;
    let mut total = 0f32;
    for _ in 0..octaves {
        let (gw, gh) = (w / cell + 2, h / cell + 2);
        let lattice: Vec<f32> = (0..gw * gh)
            .map(|_| (next(&mut state) >> 40) as f32 / (1u64 << 24) as f32)
            .collect();
        let smooth = |t: f32| t * t * (3.0 - 2.0 * t);
        for y in 0..h {
            let (gy, ty) = (y / cell, smooth((y % cell) as f32 / cell as f32));
            for x in 0..w {
                let (gx, tx) = (x / cell, smooth((x % cell) as f32 / cell as f32));
                let at = |i: usize, j: usize| lattice[(gy + j) * gw + gx + i];
                let top = at(0, 0) + (at(1, 0) - at(0, 0)) * tx;
                let bottom = at(0, 1) + (at(1, 1) - at(0, 1)) * tx;
                out[y * w + x] += amp * (top + (bottom - top) * ty);
            }
        }
        total += amp;
        amp *= 0.6;
        cell = (cell / 2).max(2);
    }
    for v in &mut out {
        *v *= 255.0 / total;
    }
    out
}

impl Pan {
    /// A pan for frames of `width` x `height` (even sizes; 4:2:0 halves both).
    pub fn new(width: usize, height: usize) -> Self {
        let (width, height) = (width.max(2) & !1, height.max(2) & !1);
        let tex_w = (width + width / 2 + PAN_STEP) & !1;
        let tex_h = (height + 2 * SWAY + 2) & !1;
        let mut luma = fractal(tex_w, tex_h, (width / 6).max(4), 7, 0x5EED);
        // Hard-edged shapes: what a street or a lab has and value noise lacks.
        let mut state = 0xC0FFEE_u64;
        let shapes = (tex_w * tex_h / 20_000).clamp(4, 400);
        for _ in 0..shapes {
            let cx = (next(&mut state) % tex_w as u64) as usize;
            let cy = (next(&mut state) % tex_h as u64) as usize;
            let r = 4 + (next(&mut state) % (width as u64 / 16 + 1)) as usize;
            let shade = (next(&mut state) % 256) as f32;
            let square = next(&mut state) % 2 == 0;
            for y in cy.saturating_sub(r)..(cy + r).min(tex_h) {
                for x in cx.saturating_sub(r)..(cx + r).min(tex_w) {
                    let (dx, dy) = (x.abs_diff(cx), y.abs_diff(cy));
                    if square || dx * dx + dy * dy <= r * r {
                        let p = &mut luma[y * tex_w + x];
                        *p = *p * 0.35 + shade * 0.65;
                    }
                }
            }
        }
        let (cw, ch) = (tex_w / 2, tex_h / 2);
        let u = fractal(cw, ch, (width / 8).max(4), 4, 0xB1u64);
        let v = fractal(cw, ch, (width / 8).max(4), 4, 0xCA7u64);
        let to_u8 = |f: f32, lo: f32, span: f32| (lo + f * span / 255.0).clamp(0.0, 255.0) as u8;
        Pan {
            width,
            height,
            tex_w,
            tex_h,
            tex_y: luma.iter().map(|&f| to_u8(f, 16.0, 219.0)).collect(),
            tex_u: u.iter().map(|&f| to_u8(f, 88.0, 80.0)).collect(),
            tex_v: v.iter().map(|&f| to_u8(f, 88.0, 80.0)).collect(),
            y: vec![0; width * height],
            u: vec![0; width * height / 4],
            v: vec![0; width * height / 4],
            noise: 0x9E37_79B9_7F4A_7C15,
            noise_amp: NOISE,
        }
    }

    /// The same pan without the sensor noise: what the camera films, as a reference for the
    /// quality of an encode (tests/bench/video.sh).
    pub fn without_noise(mut self) -> Self {
        self.noise_amp = 0;
        self
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
    }

    /// The window's top-left corner in frame `n`: back and forth across the still, with a sway.
    fn origin(&self, n: u64) -> (usize, usize) {
        let span = (self.tex_w - self.width) as u64;
        let travel = (n * PAN_STEP as u64) % (2 * span.max(1));
        let x = if travel <= span {
            travel
        } else {
            2 * span - travel
        };
        let phase = (n % 240) as f64 / 240.0 * std::f64::consts::TAU;
        let y = SWAY as f64 * (1.0 + phase.sin());
        (
            x as usize & !1,
            (y as usize).min(self.tex_h - self.height) & !1,
        )
    }

    /// Draws frame `n`; returns its planes (Y, U, V; strides width, width/2, width/2).
    pub fn draw(&mut self, n: u64) -> (&[u8], &[u8], &[u8]) {
        let (x0, y0) = self.origin(n);
        let (w, h) = (self.width, self.height);
        for row in 0..h {
            let src = &self.tex_y[(y0 + row) * self.tex_w + x0..][..w];
            let dst = &mut self.y[row * w..][..w];
            for (d, &s) in dst.iter_mut().zip(src) {
                let r = next(&mut self.noise);
                // Two uniform draws: a triangular distribution around 0.
                let a = (r & 0xFF) as i32 * (self.noise_amp + 1) / 256;
                let b = ((r >> 8) & 0xFF) as i32 * (self.noise_amp + 1) / 256;
                *d = (s as i32 + a - b).clamp(0, 255) as u8;
            }
        }
        let (cw, ch, tcw) = (w / 2, h / 2, self.tex_w / 2);
        for row in 0..ch {
            let at = (y0 / 2 + row) * tcw + x0 / 2;
            self.u[row * cw..][..cw].copy_from_slice(&self.tex_u[at..][..cw]);
            self.v[row * cw..][..cw].copy_from_slice(&self.tex_v[at..][..cw]);
        }
        (&self.y, &self.u, &self.v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_move_and_carry_noise_and_texture() {
        let mut pan = Pan::new(64, 48);
        let a = pan.draw(0).0.to_vec();
        let a_again = pan.draw(0).0.to_vec();
        let b = pan.draw(5).0.to_vec();
        // The same position differs only by noise (at most 2 * NOISE per sample).
        assert!(a
            .iter()
            .zip(&a_again)
            .all(|(x, y)| x.abs_diff(*y) as i32 <= 2 * NOISE));
        assert_ne!(a, a_again, "noise is fresh in every frame");
        // Texture: the luma spans a wide range, and a later frame shows another window.
        let (lo, hi) = (a.iter().min().unwrap(), a.iter().max().unwrap());
        assert!(hi - lo > 60, "texture range {lo}..{hi}");
        let moved = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x.abs_diff(**y) > 8)
            .count();
        assert!(
            moved > a.len() / 10,
            "the pan moved ({moved} samples changed)"
        );
    }
}
