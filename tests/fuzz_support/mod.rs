//! A small seeded mutation fuzzer that runs on the stable toolchain: a
//! SplitMix64 generator, byte- and text-level mutations (bit flips,
//! insertions, deletions, splices of two valid samples, integer boundary
//! values in binary and decimal form, deep JSON nesting, huge counts), and a
//! driver that feeds every input to a check under `catch_unwind`.
//!
//! Input `i` of a run is a pure function of the run's seed and `i`, so a
//! failure is replayed alone with `FUZZ_SEED=<seed> FUZZ_ONE=<i>`. Knobs
//! (environment):
//! - `FUZZ_SEED`: the run's seed (default 1: `make test` is reproducible;
//!   `make fuzz` passes a fresh one and prints it);
//! - `FUZZ_ITERS`: mutated inputs per target (default 1500);
//! - `FUZZ_SECS`: time budget per target in seconds (default 1); the run
//!   stops at whichever bound comes first;
//! - `FUZZ_ONE`: run only input number `i` (plus nothing else);
//! - `FUZZ_SAVE=1`: a failing input is also written under
//!   `tests/fuzz/regressions/<target>/`, where every later run replays it.
//!
//! The module knows nothing of gombus: the crate's own unit tests include
//! it too, for decoders that are private to the crate.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// SplitMix64: tiny, fast, and good enough to pick mutations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability 1 in `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integer boundaries as binary values (written little- or big-endian at
/// any offset, in 1, 2, 4 or 8 bytes).
pub const BOUNDARIES: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
    u64::MAX - 1,
];

/// Numbers as JSON or HTTP text: boundaries, negatives, floats, exponents.
pub const NUMBER_TEXTS: &[&str] = &[
    "0",
    "1",
    "-1",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967295",
    "4294967296",
    "9007199254740991",
    "9007199254740992",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "99999999999999999999999999999999999999",
    "1e308",
    "1e999",
    "-0",
    "0.5",
    "1.0",
    "01",
    "00000000000000000000000000000001",
];

/// Short tokens that matter to the text formats under test.
pub const TOKENS: &[&str] = &[
    "\r\n",
    "\r\n\r\n",
    "\n",
    ":",
    ",",
    "-",
    "/",
    "?",
    "&",
    "=",
    "\x1e",
    "\"",
    "\\",
    "\\u0000",
    "\\ud800",
    "[",
    "]",
    "{",
    "}",
    "null",
    "true",
    "{\"_placeholder\":true,\"num\":0}",
    "{\"_placeholder\":true,\"num\":64}",
    "\u{0}",
    "\u{7f}",
    "é",
    "\u{10ffff}",
    "\u{feff}",
    "*",
    ">",
    "..",
    " ",
    "\t",
    "b",
    "b4",
    "HTTP/1.1",
    "Content-Length: ",
    "Transfer-Encoding: chunked",
];

/// Applies one to six random mutations to `data`, drawing splice partners
/// from `corpus`. The result never exceeds `max_len` bytes.
pub fn mutate(rng: &mut Rng, corpus: &[Vec<u8>], data: &mut Vec<u8>, max_len: usize) {
    let rounds = 1 + rng.below(6);
    mutate_rounds(rng, corpus, data, max_len, rounds);
}

/// Applies exactly `rounds` random mutations (one keeps most of a valid
/// sample intact, so it gets past the first checks more often).
pub fn mutate_rounds(
    rng: &mut Rng,
    corpus: &[Vec<u8>],
    data: &mut Vec<u8>,
    max_len: usize,
    rounds: usize,
) {
    for _ in 0..rounds {
        mutate_once(rng, corpus, data);
    }
    data.truncate(max_len);
}

fn mutate_once(rng: &mut Rng, corpus: &[Vec<u8>], data: &mut Vec<u8>) {
    let len = data.len();
    match rng.below(16) {
        // A flipped bit.
        0 | 1 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        // A random byte.
        2 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next_u64() as u8;
        }
        // Random bytes inserted.
        3 => {
            let n = 1 + rng.below(8);
            let at = rng.below(len + 1);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, bytes);
        }
        // A range deleted.
        4 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(16));
            data.drain(at..at + n);
        }
        // A range repeated (lengths no longer match the content).
        5 if len > 0 => {
            let at = rng.below(len);
            let n = 1 + rng.below((len - at).min(32));
            let copy = data[at..at + n].to_vec();
            let times = 1 + rng.below(4);
            for _ in 0..times {
                data.splice(at..at, copy.iter().copied());
            }
        }
        // Spliced with another valid sample: the head of one, the tail of
        // the other.
        6 if !corpus.is_empty() => {
            let other = rng.pick(corpus);
            let cut_a = rng.below(len + 1);
            let cut_b = rng.below(other.len() + 1);
            data.truncate(cut_a);
            data.extend_from_slice(&other[cut_b..]);
        }
        // A binary integer boundary over the bytes at some offset (length
        // fields, counts, sequence numbers).
        7 | 8 if len > 0 => {
            let v = *rng.pick(BOUNDARIES);
            let width = *rng.pick(&[1usize, 2, 4, 8]);
            let bytes = if rng.one_in(2) {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            let bytes = if rng.one_in(2) {
                &bytes[..width]
            } else {
                &bytes[8 - width..]
            };
            let at = rng.below(len);
            for (k, b) in bytes.iter().enumerate() {
                if let Some(slot) = data.get_mut(at + k) {
                    *slot = *b;
                }
            }
        }
        // A decimal number replaced by a boundary (or one inserted).
        9 | 10 => {
            let text = rng.pick(NUMBER_TEXTS).as_bytes();
            match digit_runs(data).as_slice() {
                [] => {
                    let at = rng.below(len + 1);
                    data.splice(at..at, text.iter().copied());
                }
                runs => {
                    let (a, b) = *rng.pick(runs);
                    data.splice(a..b, text.iter().copied());
                }
            }
        }
        // A token inserted or written over.
        11 => {
            let t = rng.pick(TOKENS).as_bytes();
            let at = rng.below(len + 1);
            if rng.one_in(2) || at == len {
                data.splice(at..at, t.iter().copied());
            } else {
                let end = (at + t.len()).min(len);
                data.splice(at..end, t.iter().copied());
            }
        }
        // Deep nesting: JSON arrays or objects far past any sane depth.
        12 => {
            let depth = *rng.pick(&[64usize, 129, 1_000, 20_000]);
            let at = rng.below(len + 1);
            let (open, close): (&[u8], &[u8]) = if rng.one_in(2) {
                (b"[", b"]")
            } else {
                (b"{\"a\":", b"}")
            };
            let mut nest = open.repeat(depth);
            if rng.one_in(2) {
                nest.extend_from_slice(b"1");
                nest.extend(close.repeat(depth));
            }
            data.splice(at..at, nest);
        }
        // A huge repeat of one byte (long names, huge headers, long runs
        // of digits in a count).
        13 => {
            let b = if rng.one_in(2) {
                b'9'
            } else {
                rng.next_u64() as u8
            };
            let n = *rng.pick(&[100usize, 1_000, 10_000, 70_000]);
            let at = rng.below(len + 1);
            data.splice(at..at, std::iter::repeat_n(b, n));
        }
        // Cut short.
        14 if len > 0 => {
            data.truncate(rng.below(len));
        }
        // Cut at the front.
        15 if len > 0 => {
            data.drain(..rng.below(len) + 1);
        }
        _ => {
            data.push(rng.next_u64() as u8);
        }
    }
}

/// The byte ranges of runs of ASCII digits.
fn digit_runs(data: &[u8]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < data.len() {
        if data[i].is_ascii_digit() {
            let start = i;
            while i < data.len() && data[i].is_ascii_digit() {
                i += 1;
            }
            runs.push((start, i));
        } else {
            i += 1;
        }
    }
    runs
}

/// How a run is bounded and which inputs it makes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub iters: u64,
    pub budget: Duration,
    pub one: Option<u64>,
    pub save: bool,
}

impl Plan {
    /// Reads the `FUZZ_*` variables (see the module docs).
    pub fn from_env() -> Plan {
        let num = |name: &str| {
            std::env::var(name).ok().map(|v| {
                v.trim()
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
            })
        };
        let secs = std::env::var("FUZZ_SECS")
            .ok()
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("FUZZ_SECS={v:?} is not a number"))
            })
            .unwrap_or(1.0);
        Plan {
            seed: num("FUZZ_SEED").unwrap_or(1),
            iters: num("FUZZ_ITERS").unwrap_or(1500),
            budget: Duration::from_secs_f64(secs),
            one: num("FUZZ_ONE"),
            save: std::env::var("FUZZ_SAVE").is_ok_and(|v| v == "1"),
        }
    }

    /// The generator of input `i`: independent of every other input.
    pub fn rng_for(&self, i: u64) -> Rng {
        let mut r = Rng::new(self.seed ^ i.wrapping_mul(0xA24B_AED4_963E_E407));
        r.next_u64();
        r
    }
}

/// One input that broke a property.
#[derive(Debug)]
pub struct Failure {
    pub origin: String,
    pub input: Vec<u8>,
    pub why: String,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub inputs: u64,
    pub failures: Vec<Failure>,
}

/// Where a target's regression samples live.
pub fn regressions_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/regressions")
        .join(target)
}

/// The stored regression samples of `target`, sorted by name.
pub fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(regressions_dir(target)) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .filter_map(|e| {
            let bytes = std::fs::read(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), bytes))
        })
        .collect();
    out.sort();
    out
}

/// Runs `check` on a panic-proof footing: a panic becomes an `Err` with its
/// message.
pub fn guarded(
    check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    input: &[u8],
) -> Result<(), String> {
    IN_INPUT.with(|f| f.set(true));
    let r = panic::catch_unwind(AssertUnwindSafe(|| check(input)));
    IN_INPUT.with(|f| f.set(false));
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Err(format!("panic: {msg}"))
        }
    }
}

/// Fuzzes `target`: its regression samples, every valid sample whole and
/// (for samples up to `truncate_upto` bytes) cut at every byte, then
/// mutated inputs until the plan's bounds. `check` returns `Err` for a
/// broken property; a panic counts as one.
pub fn run(
    target: &str,
    corpus: &[Vec<u8>],
    max_len: usize,
    truncate_upto: usize,
    check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
) -> Outcome {
    let plan = Plan::from_env();
    install_quiet_hook();
    let mut out = Outcome::default();
    let note = |out: &mut Outcome, origin: String, input: &[u8], r: Result<(), String>| {
        out.inputs += 1;
        if let Err(why) = r {
            out.failures.push(Failure {
                origin,
                input: input.to_vec(),
                why,
            });
        }
    };
    if plan.one.is_none() {
        for (name, bytes) in regressions(target) {
            let r = guarded(check, &bytes);
            note(&mut out, format!("regression sample {name}"), &bytes, r);
        }
        for (k, sample) in corpus.iter().enumerate() {
            let r = guarded(check, sample);
            note(&mut out, format!("corpus sample {k}"), sample, r);
            if sample.len() <= truncate_upto {
                for cut in 0..sample.len() {
                    let r = guarded(check, &sample[..cut]);
                    note(
                        &mut out,
                        format!("corpus sample {k} cut at {cut}"),
                        &sample[..cut],
                        r,
                    );
                }
            }
        }
    }
    let mut current = plan.save.then(|| Current::open(target)).flatten();
    let start = Instant::now();
    let range = match plan.one {
        Some(i) => i..i + 1,
        None => 0..plan.iters,
    };
    for i in range {
        if plan.one.is_none() && start.elapsed() > plan.budget {
            break;
        }
        let input = make_input(&plan, corpus, i, max_len);
        if let Some(c) = current.as_mut() {
            c.keep(i, &input);
        }
        let r = guarded(check, &input);
        note(&mut out, format!("input {i}"), &input, r);
        if out.failures.len() >= 5 {
            break;
        }
    }
    report(target, &plan, &out);
    out
}

/// Mutated input number `i` of a plan.
pub fn make_input(plan: &Plan, corpus: &[Vec<u8>], i: u64, max_len: usize) -> Vec<u8> {
    let mut rng = plan.rng_for(i);
    let mut input = if corpus.is_empty() {
        Vec::new()
    } else {
        rng.pick(corpus).clone()
    };
    mutate(&mut rng, corpus, &mut input, max_len);
    input
}

/// Prints the run's figures and, per failure, the input as hex, why it
/// failed and the command that replays it; saves failing inputs when asked.
pub fn report(target: &str, plan: &Plan, out: &Outcome) {
    eprintln!(
        "fuzz {target}: seed {} | {} inputs | {} failures",
        plan.seed,
        out.inputs,
        out.failures.len()
    );
    for f in &out.failures {
        eprintln!("fuzz {target}: FAILED on {}: {}", f.origin, f.why);
        eprintln!("{}", hex_dump(&f.input, 512));
        if let Some(i) = f.origin.strip_prefix("input ") {
            eprintln!(
                "replay: FUZZ_SEED={} FUZZ_ONE={i} {}",
                plan.seed,
                replay_command(target)
            );
        }
        if plan.save {
            let dir = regressions_dir(target);
            let name = format!("crash-{:016x}.bin", fnv1a(&f.input));
            let saved = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join(&name), &f.input));
            match saved {
                Ok(()) => eprintln!("saved as tests/fuzz/regressions/{target}/{name}"),
                Err(e) => eprintln!("could not save the input: {e}"),
            }
        }
    }
}

/// Where the input running now is kept while saving is on: an input that
/// aborts the process (memory exhausted, a stack overflow) is then still
/// there for `scripts/fuzz.sh` to turn into a regression sample.
pub fn current_path(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/fuzz-current")
        .join(target)
}

/// The running input on disk, rewritten in place (no open or close per
/// input).
struct Current {
    input: std::fs::File,
    number: std::fs::File,
}

impl Current {
    fn open(target: &str) -> Option<Current> {
        let path = current_path(target);
        std::fs::create_dir_all(path.parent()?).ok()?;
        Some(Current {
            input: std::fs::File::create(&path).ok()?,
            number: std::fs::File::create(path.with_extension("input")).ok()?,
        })
    }

    fn keep(&mut self, i: u64, input: &[u8]) {
        use std::os::unix::fs::FileExt;
        let _ = self.input.set_len(0);
        let _ = self.input.write_all_at(input, 0);
        let n = format!("{i:<20}");
        let _ = self.number.write_all_at(n.as_bytes(), 0);
    }
}

/// The cargo command that runs `target` alone (the crate's own unit tests
/// include this module too, under `gombus::`).
pub fn replay_command(target: &str) -> String {
    match module_path!().strip_prefix("gombus::") {
        Some(path) => {
            let parent = path.rsplit_once("::").map_or("", |(p, _)| p);
            format!(
                "cargo test --profile fuzz --lib -- --exact {parent}::fuzz::{target} --nocapture"
            )
        }
        None => format!("cargo test --profile fuzz --test fuzz -- --exact {target} --nocapture"),
    }
}

/// FNV-1a, to name saved inputs by content.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `xxd`-style lines for the first `max` bytes.
pub fn hex_dump(bytes: &[u8], max: usize) -> String {
    let mut s = String::new();
    for (row, chunk) in bytes[..bytes.len().min(max)].chunks(16).enumerate() {
        let _ = write!(s, "  {:06x}:", row * 16);
        for b in chunk {
            let _ = write!(s, " {b:02x}");
        }
        s.push_str(&"   ".repeat(16 - chunk.len()));
        s.push_str("  ");
        for &b in chunk {
            s.push(if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            });
        }
        s.push('\n');
    }
    if bytes.len() > max {
        let _ = write!(s, "  … {} bytes in all", bytes.len());
    }
    s
}

thread_local! {
    static IN_INPUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Silences the default panic message on threads that are running an
/// input (a failing input is reported once, with its hex dump); panics
/// anywhere else print as usual.
pub fn install_quiet_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !IN_INPUT.with(|f| f.get()) {
                previous(info);
            }
        }));
    });
}

/// Fails the calling test when a run had failures.
pub fn assert_clean(target: &str, out: &Outcome) {
    assert!(
        out.failures.is_empty(),
        "fuzz {target}: {} failing input(s), first: {} ({}); see the report above",
        out.failures.len(),
        out.failures[0].origin,
        out.failures[0].why
    );
}
