//! What the gateway hands back: the answer with every credential cut out, and its token
//! usage read as it streams past.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hyper::body::Bytes;

use super::{Body, HostMetrics, Stats};

pub(super) const REDACTED: &str = "[redacted by mosaic]";

/// An answer's body with every credential cut out, even one split across two chunks. It
/// holds back only the end of a chunk that could begin a credential, so a streamed answer
/// is not delayed otherwise.
pub(super) struct Redacted {
    pub(super) inner: Body,
    pub(super) keys: Arc<Vec<Vec<u8>>>,
    pub(super) carry: Vec<u8>,
    /// A trailers frame, passed on once the carry before it is out.
    pub(super) pending: Option<hyper::body::Frame<Bytes>>,
    pub(super) done: bool,
}

impl Redacted {
    /// Cuts every key out of the carry; returns how many bytes at its end must wait (the
    /// longest end that begins some key).
    fn redact(&mut self) -> usize {
        for k in self.keys.iter() {
            let mut from = 0;
            while let Some(at) = find(&self.carry[from..], k) {
                let at = from + at;
                self.carry
                    .splice(at..at + k.len(), REDACTED.bytes())
                    .for_each(drop);
                from = at + REDACTED.len();
            }
        }
        let n = self.carry.len();
        (1..n.min(self.keys.iter().map(Vec::len).max().unwrap_or(0)))
            .rev()
            .find(|k| {
                self.keys
                    .iter()
                    .any(|key| key.starts_with(&self.carry[n - k..]))
            })
            .unwrap_or(0)
    }
}

impl hyper::body::Body for Redacted {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        loop {
            if let Some(f) = this.pending.take() {
                return Poll::Ready(Some(Ok(f)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.carry.extend_from_slice(&data);
                        let keep = this.redact();
                        let emit = this.carry.len() - keep;
                        if emit == 0 {
                            continue;
                        }
                        let out: Vec<u8> = this.carry.drain(..emit).collect();
                        return Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(out)))));
                    }
                    Err(other) => {
                        this.pending = Some(other);
                        if !this.carry.is_empty() {
                            let out = std::mem::take(&mut this.carry);
                            return Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(
                                out,
                            )))));
                        }
                    }
                },
                Poll::Ready(None) => {
                    this.done = true;
                    if !this.carry.is_empty() {
                        let out = std::mem::take(&mut this.carry);
                        return Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(out)))));
                    }
                }
            }
        }
    }
}

/// Reads an answer's token usage as it streams past, and counts it once the answer's body
/// is gone (finished or abandoned). Within one answer each field is taken at its largest:
/// streamed APIs repeat a running total (Anthropic's `message_delta`), so a sum would
/// count twice.
pub(super) struct Usage {
    /// The end of the previous chunk, so a field split across two chunks is still seen.
    pub(super) tail: Vec<u8>,
    pub(super) input: u64,
    pub(super) output: u64,
    pub(super) stats: Arc<Stats>,
    pub(super) metrics: Arc<HostMetrics>,
    pub(super) runtime: String,
    /// The effect this answer belongs to: its usage goes with its observation.
    pub(super) settle: Option<Arc<super::settle::Settle>>,
}

/// `"name":` patterns (with the leading quote, so `cache_read_input_tokens` is not
/// `input_tokens`) and whether each counts as input.
const FIELDS: &[(&[u8], bool)] = &[
    (b"\"input_tokens\":", true),
    (b"\"prompt_tokens\":", true),
    (b"\"output_tokens\":", false),
    (b"\"completion_tokens\":", false),
];

const TAIL: usize = 48;

impl Usage {
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(chunk);
        for (pat, input) in FIELDS {
            let mut from = 0;
            while let Some(at) = find(&buf[from..], pat) {
                let start = from + at + pat.len();
                let digits: Vec<u8> = buf[start..]
                    .iter()
                    .skip_while(|c| **c == b' ')
                    .take_while(|c| c.is_ascii_digit())
                    .copied()
                    .collect();
                if let Some(n) = std::str::from_utf8(&digits)
                    .ok()
                    .and_then(|d| d.parse::<u64>().ok())
                {
                    let slot = if *input {
                        &mut self.input
                    } else {
                        &mut self.output
                    };
                    *slot = (*slot).max(n);
                }
                from = start;
            }
        }
        let keep = buf.len().saturating_sub(TAIL);
        self.tail = buf.split_off(keep);
        if let Some(s) = &self.settle {
            s.input.fetch_max(self.input, Ordering::SeqCst);
            s.output.fetch_max(self.output, Ordering::SeqCst);
        }
    }
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Drop for Usage {
    fn drop(&mut self) {
        self.stats
            .input_tokens
            .fetch_add(self.input, Ordering::Relaxed);
        self.stats
            .output_tokens
            .fetch_add(self.output, Ordering::Relaxed);
        for (dir, n) in [("input", self.input), ("output", self.output)] {
            self.metrics
                .provider_tokens
                .get_or_create(&HostMetrics::runtime_direction(&self.runtime, dir))
                .inc_by(n);
        }
    }
}
