//! The activation check's text, in one place: the challenge line the supervisor types (or
//! the lane socket hands out), and the ACK line a harness answers with.
//!
//! A challenge is `mosaic-challenge:<phrase>`, the phrase being hex derived from the
//! challenge and the generation (`adapter::ack_phrase`). The answer must carry
//! `mosaic-ack:<phrase>-<contract key>` as one token: the phrase proves the challenge was
//! seen, the key (which only the contract text carries) that the contract was.
//!
//! A handoff's target answers its handoff check the same way under its own prefixes:
//! `mosaic-handoff:<phrase>` asks, `mosaic-handoff-ack:<phrase>-<contract key>` answers, the
//! phrase derived under another label (`adapter::handoff_phrase`). Neither answer can stand
//! in for the other: the tokens differ in their prefix and their phrase.
//!
//! **Never:** another module formats or parses these prefixes by hand.

const CHALLENGE: &str = "mosaic-challenge:";
const ACK: &str = "mosaic-ack:";
const HANDOFF: &str = "mosaic-handoff:";
const HANDOFF_ACK: &str = "mosaic-handoff-ack:";

/// Which of a generation's two checks a line asks or an answer binds: the activation check
/// every generation answers, or the handoff check a handoff's target answers first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Activation,
    Handoff,
}

impl Check {
    fn prefixes(self) -> (&'static str, &'static str) {
        match self {
            Check::Activation => (CHALLENGE, ACK),
            Check::Handoff => (HANDOFF, HANDOFF_ACK),
        }
    }

    /// The check's token for `phrase` (what the line typed into a harness carries).
    pub fn token(self, phrase: &str) -> String {
        format!("{}{phrase}", self.prefixes().0)
    }

    /// The line typed into a harness's TUI: the check's token and how to answer it.
    pub fn prompt(self, phrase: &str) -> String {
        match self {
            Check::Activation => challenge_prompt(phrase),
            Check::Handoff => format!(
                "{} Mosaic handoff check: this lane is offered work another lane ran; to take \
                 it, reply with exactly {HANDOFF_ACK}{phrase}-<your Mosaic contract key>",
                self.token(phrase)
            ),
        }
    }

    /// The answer that passes this check for `phrase` under the contract `key`.
    pub fn answer(self, phrase: &str, key: &str) -> String {
        format!("{}{phrase}-{key}", self.prefixes().1)
    }

    /// An answer without a contract key (what a model that never saw its contract can say;
    /// it never binds).
    pub fn answer_without_key(self, phrase: &str) -> String {
        format!("{}{phrase}", self.prefixes().1)
    }

    /// Whether `answer` carries [`Check::answer`]`(phrase, key)` as one token, compared in
    /// constant time.
    pub fn binds(self, answer: &str, phrase: &str, key: &str) -> bool {
        let want = self.answer(phrase, key);
        answer
            .split(|c: char| c.is_whitespace() || "`\"'.,*()[]".contains(c))
            .fold(false, |found, tok| {
                found | crate::util::ct::eq(tok.as_bytes(), want.as_bytes())
            })
    }

    /// The phrase of the last such check in free text (a model's view of its conversation).
    pub fn find(self, text: &str) -> Option<String> {
        let prefix = self.prefixes().0;
        let i = text.rfind(prefix)?;
        let hex: String = text[i + prefix.len()..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit())
            .collect();
        (!hex.is_empty()).then_some(hex)
    }
}

/// The challenge token for `phrase`.
pub fn challenge(phrase: &str) -> String {
    format!("{CHALLENGE}{phrase}")
}

/// The line typed into a harness's TUI: the challenge token and how to answer it.
pub fn challenge_prompt(phrase: &str) -> String {
    format!(
        "{} Mosaic activation check: reply with exactly {ACK}{phrase}-<your Mosaic contract key>",
        challenge(phrase)
    )
}

/// The phrase of a challenge token handed out whole (the lane socket's answer).
pub fn parse_challenge(token: &str) -> Option<&str> {
    token
        .strip_prefix(CHALLENGE)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The phrase of the last challenge in free text (a model's view of its conversation):
/// the hex digits that follow the last challenge prefix.
pub fn find_challenge(text: &str) -> Option<String> {
    Check::Activation.find(text)
}

/// The answer that acknowledges `phrase` under the contract `key`.
pub fn ack(phrase: &str, key: &str) -> String {
    Check::Activation.answer(phrase, key)
}

/// An answer without a contract key (what a model that never saw its contract can say; it
/// never binds).
pub fn ack_without_key(phrase: &str) -> String {
    Check::Activation.answer_without_key(phrase)
}

/// Whether `answer` acknowledges: it carries [`ack`]`(phrase, key)` as one token, compared
/// in constant time.
pub fn answer_binds(answer: &str, phrase: &str, key: &str) -> bool {
    Check::Activation.binds(answer, phrase, key)
}

// The contract text and the two derived values the ACK binds.

/// The text every family puts in front of the model as its contract. It carries the
/// contract key, which the activation answer must repeat: only a model that has this text
/// in its context can acknowledge.
pub fn contract_context(task_text: &str, contracts_digest: &str, key: &str) -> String {
    format!(
        "Mosaic contract {contracts_digest}, contract key {key}. You run as one generation of \
         a Mosaic lane; your task follows. When Mosaic sends an activation check (a line with \
         mosaic-challenge:<hex>) or a handoff check (mosaic-handoff:<hex>), answer it exactly \
         as asked before anything else. Write your latest test results to .mosaic/test-result \
         in your working directory: Mosaic counts them, with your changed files and commits, \
         as your progress.\n\n{task_text}"
    )
}

fn derive(label: &[u8], parts: &[&[u8]]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(label);
    for p in parts {
        h.update(b"\0");
        h.update(p);
    }
    hex::encode(&h.finalize()[..16])
}

/// The key a generation's contract text carries (derived from the contract's digest and the
/// generation, so a contract delivered to another generation does not fit).
pub fn contract_key(contracts_digest: &str, lane_incarnation_id: &str, generation: u64) -> String {
    derive(
        b"mosaic contract key v1",
        &[
            contracts_digest.as_bytes(),
            lane_incarnation_id.as_bytes(),
            &generation.to_be_bytes(),
        ],
    )[..12]
        .to_string()
}

/// The phrase a harness must answer to acknowledge `challenge_id`: derived from the
/// challenge and the generation, so it cannot be produced without seeing the challenge
/// turn, and it does not reveal the challenge id itself.
pub fn ack_phrase(challenge_id: &str, lane_incarnation_id: &str, generation: u64) -> String {
    derive(
        b"mosaic harness ack v1",
        &[
            challenge_id.as_bytes(),
            lane_incarnation_id.as_bytes(),
            &generation.to_be_bytes(),
        ],
    )
}

/// The phrase a handoff's target must answer to acknowledge `handoff_challenge_id`:
/// derived like [`ack_phrase`] under its own label, so no activation phrase is ever a
/// handoff phrase.
pub fn handoff_phrase(
    handoff_challenge_id: &str,
    lane_incarnation_id: &str,
    generation: u64,
) -> String {
    derive(
        b"mosaic harness handoff ack v1",
        &[
            handoff_challenge_id.as_bytes(),
            lane_incarnation_id.as_bytes(),
            &generation.to_be_bytes(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_round_trips_and_only_hex_phrases_parse() {
        let p = "0a1b2c";
        assert_eq!(parse_challenge(&challenge(p)), Some(p));
        assert_eq!(find_challenge(&challenge_prompt(p)).as_deref(), Some(p));
        assert_eq!(parse_challenge("mosaic-challenge:"), None);
        assert_eq!(parse_challenge("mosaic-challenge:zz"), None);
        assert_eq!(parse_challenge("mosaic-ack:0a"), None);
        assert_eq!(find_challenge("no challenge here"), None);
    }

    #[test]
    fn only_the_whole_token_with_the_key_binds() {
        let (p, k) = ("0a1b", "00ff00ff");
        assert!(answer_binds(&ack(p, k), p, k));
        assert!(answer_binds(&format!("Sure. `{}`.", ack(p, k)), p, k));
        assert!(!answer_binds(&ack_without_key(p), p, k));
        assert!(!answer_binds(&format!("{}0", ack(p, k)), p, k));
        assert!(!answer_binds(&challenge(p), p, k));
    }

    #[test]
    fn a_handoff_answer_never_passes_the_activation_check_nor_the_reverse() {
        let (id, inc, k) = ("c-1", "inc-1", "00ff00ff");
        let (a, h) = (ack_phrase(id, inc, 3), handoff_phrase(id, inc, 3));
        assert_ne!(a, h, "the same id gives two phrases");
        assert!(Check::Handoff.binds(&Check::Handoff.answer(&h, k), &h, k));
        assert!(Check::Activation.binds(&Check::Activation.answer(&a, k), &a, k));
        // Each answer form, with either phrase, fails the other check.
        for p in [&a, &h] {
            assert!(!Check::Activation.binds(&Check::Handoff.answer(p, k), p, k));
            assert!(!Check::Handoff.binds(&Check::Activation.answer(p, k), p, k));
        }
        // Each line is found only as its own check.
        assert_eq!(
            Check::Handoff.find(&Check::Handoff.prompt(&h)),
            Some(h.clone())
        );
        assert_eq!(Check::Activation.find(&Check::Handoff.prompt(&h)), None);
        assert_eq!(Check::Handoff.find(&Check::Activation.prompt(&a)), None);
    }
}
