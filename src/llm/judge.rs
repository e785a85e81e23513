//! Questions answered with probabilities: the prompts of `ai_filter` and `ai_classify`, and the
//! probability of each answer read from the endpoint's log-probabilities of the reply's first
//! token (`logprobs` and `top_logprobs`), never from generated text.
//!
//! A yes-or-no question's probability of yes is the mass of the first tokens that read `yes`
//! (any case, spaces and a trailing `.` aside) over the mass of those that read `yes` or `no`.
//! A classification lists the labels lettered `A`, `B`, ...; each label's probability is the
//! mass of the first tokens that are its letter (a trailing `.` or `)` aside), normalized over
//! the labels. Tokens outside the endpoint's likeliest [`TOP_LOGPROBS`] count nothing.

use serde_json::{Value, json};

use super::client::{Reply, Unanswered};

/// The likeliest first tokens asked for (OpenAI's most).
pub const TOP_LOGPROBS: usize = 20;

/// The most labels a classification may have: one letter each, all within
/// [`TOP_LOGPROBS`].
pub const MAX_LABELS: usize = TOP_LOGPROBS;

/// A label of `ai_classify`, and what it means when the label alone does not say.
#[derive(Debug, Clone, PartialEq)]
pub struct Label {
    pub name: String,
    pub description: Option<String>,
}

/// `body` (a chat request) made to answer with one token and the log-probabilities of the
/// likeliest.
pub fn asking_for_probabilities(mut body: Value) -> Value {
    body["max_tokens"] = json!(1);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(TOP_LOGPROBS);
    body
}

/// The prompt of `ai_filter`: the question, each input's value on a line of its own (the
/// same whatever the query names them, so that the same question about the same values is the
/// same request, answered once and cached), and the answer asked for.
pub fn filter_prompt(question: &str, inputs: &[&str]) -> String {
    let mut prompt = format!("{}\n\n", question.trim());
    for value in inputs {
        prompt.push_str(value);
        prompt.push('\n');
    }
    prompt.push_str("\nAnswer with yes or no.");
    prompt
}

/// The letter of the `i`-th label.
pub fn letter(i: usize) -> char {
    (b'A' + i as u8) as char
}

/// The prompt of `ai_classify`: the labels lettered, the text, and the answer asked for.
pub fn classify_prompt(text: &str, labels: &[Label]) -> String {
    let mut prompt = String::from("Which of these labels fits the text best?\n\n");
    for (i, label) in labels.iter().enumerate() {
        prompt.push_str(&format!("{}. {}", letter(i), label.name));
        if let Some(description) = &label.description {
            prompt.push_str(&format!(": {description}"));
        }
        prompt.push('\n');
    }
    prompt.push_str(&format!(
        "\nText: {text}\n\nAnswer with the letter of the label."
    ));
    prompt
}

/// The likeliest first tokens of a reply with their log-probabilities.
pub fn first_tokens(reply: &Reply) -> Result<Vec<(String, f64)>, Unanswered> {
    let no_logprobs = || Unanswered::NotA {
        what: "a reply with the log-probabilities of its first token (the endpoint must \
               support `logprobs` and `top_logprobs`, as OpenAI's, vLLM's and llama.cpp's do)",
        reply: super::output::excerpt(&reply.raw),
    };
    let json: Value = serde_json::from_str(&reply.raw).map_err(|_| no_logprobs())?;
    let first = json
        .pointer("/choices/0/logprobs/content/0")
        .ok_or_else(no_logprobs)?;
    let mut tokens: Vec<(String, f64)> = Vec::new();
    let mut add = |entry: &Value| {
        if let (Some(token), Some(logprob)) = (
            entry.get("token").and_then(Value::as_str),
            entry.get("logprob").and_then(Value::as_f64),
        ) && logprob.is_finite()
            && logprob <= 0.0
            && !tokens.iter().any(|(t, _)| t == token)
        {
            tokens.push((token.to_string(), logprob));
        }
    };
    match first.get("top_logprobs").and_then(Value::as_array) {
        Some(top) if !top.is_empty() => top.iter().take(TOP_LOGPROBS).for_each(&mut add),
        _ => add(first),
    }
    if tokens.is_empty() {
        return Err(no_logprobs());
    }
    Ok(tokens)
}

/// The likeliest first tokens as a message shows them.
fn shown(tokens: &[(String, f64)]) -> String {
    tokens
        .iter()
        .take(5)
        .map(|(t, p)| format!("{t:?} ({:.3})", p.exp()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The probability of yes, from the first tokens of a yes-or-no answer.
pub fn yes_probability(tokens: &[(String, f64)]) -> Result<f64, Unanswered> {
    let mass = |word: &str| -> f64 {
        tokens
            .iter()
            .filter(|(t, _)| {
                let t = t.trim().trim_end_matches('.').to_lowercase();
                t == word
            })
            .map(|(_, p)| p.exp())
            .sum()
    };
    let (yes, no) = (mass("yes"), mass("no"));
    if yes + no <= 0.0 {
        return Err(Unanswered::NoText(format!(
            "the model's likeliest first tokens are neither yes nor no: {}",
            shown(tokens)
        )));
    }
    Ok(yes / (yes + no))
}

/// Each of `n` labels' probability, from the first tokens of a lettered answer.
pub fn label_probabilities(tokens: &[(String, f64)], n: usize) -> Result<Vec<f64>, Unanswered> {
    let mut mass = vec![0.0; n];
    for (token, logprob) in tokens {
        let t = token.trim().trim_end_matches(['.', ')']);
        let mut chars = t.chars();
        if let (Some(c), None) = (chars.next(), chars.next())
            && c.is_ascii_uppercase()
            && let Some(m) = mass.get_mut((c as u8 - b'A') as usize)
        {
            *m += logprob.exp();
        }
    }
    let total: f64 = mass.iter().sum();
    if total <= 0.0 {
        return Err(Unanswered::NoText(format!(
            "the model's likeliest first tokens are none of the labels' letters (A to {}): {}",
            letter(n - 1),
            shown(tokens)
        )));
    }
    Ok(mass.into_iter().map(|m| m / total).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|(t, p)| (t.to_string(), p.ln())).collect()
    }

    #[test]
    fn yes_is_the_mass_of_its_spellings_over_yes_and_no() {
        let t = tokens(&[
            ("No", 0.3),
            ("The", 0.2),
            (" yes", 0.1),
            ("Yes", 0.2),
            ("no.", 0.1),
        ]);
        let p = yes_probability(&t).unwrap();
        assert!((p - 0.3 / 0.7).abs() < 1e-12, "{p}");
        let none = yes_probability(&tokens(&[("The", 0.5), ("Yesterday", 0.2)])).unwrap_err();
        assert!(none.to_string().contains("neither yes nor no"), "{none}");
    }

    #[test]
    fn labels_are_their_letters_normalized_over_the_labels() {
        let t = tokens(&[("A", 0.4), (" B", 0.1), ("B.", 0.1), ("C", 0.2), ("a", 0.1)]);
        let p = label_probabilities(&t, 2).unwrap();
        assert!((p[0] - 0.4 / 0.6).abs() < 1e-12 && (p[1] - 0.2 / 0.6).abs() < 1e-12);
        assert!(label_probabilities(&tokens(&[("Z", 0.9)]), 3).is_err());
    }

    #[test]
    fn the_prompts_say_what_is_asked() {
        let labels = [
            Label {
                name: "spam".into(),
                description: Some("unsolicited advertising".into()),
            },
            Label {
                name: "ham".into(),
                description: None,
            },
        ];
        assert_eq!(
            classify_prompt("Buy now!", &labels),
            "Which of these labels fits the text best?\n\nA. spam: unsolicited advertising\n\
             B. ham\n\nText: Buy now!\n\nAnswer with the letter of the label."
        );
        assert_eq!(
            filter_prompt("Is it about cats?", &["Title: Cats", "Meow"]),
            "Is it about cats?\n\nTitle: Cats\nMeow\n\nAnswer with yes or no."
        );
    }
}
