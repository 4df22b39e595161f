use super::*;
use std::collections::HashMap;

fn bias(entries: &[(&str, f32)], text: &Text) -> Result<Vec<(u32, f32)>> {
    let map: HashMap<String, f32> = entries.iter().map(|&(k, b)| (k.to_string(), b)).collect();
    logit_bias(Some(map), text)
}

/// The message of a 400 that names `logit_bias`.
fn refusal(r: Result<Vec<(u32, f32)>>) -> String {
    match r {
        Err(GatewayError::InvalidRequest {
            param: Some(p),
            message,
            ..
        }) if p == "logit_bias" => message,
        other => panic!("expected a 400 naming `logit_bias`, got {other:?}"),
    }
}

#[test]
fn logit_bias_keys_are_canonical_token_ids_only() {
    let text = Text::words_for_vocab(1000);
    assert_eq!(
        bias(&[("0", 1.0), ("1", -2.0), ("999", 100.0)], &text).unwrap(),
        vec![(0, 1.0), (1, -2.0), (999, 100.0)]
    );
    // Each of these would name token 1 (or another id) a second way, so two keys of one
    // request could add their biases on one token.
    for key in [
        "01",
        "+1",
        " 1",
        "1 ",
        "1.0",
        "-0",
        "00",
        "",
        "1e0",
        "0x1",
        "１",
        "4294967296",
    ] {
        let message = refusal(bias(&[("1", 5.0), (key, 5.0)], &text));
        assert!(message.contains(&format!("{key:?}")), "{key:?}: {message}");
    }
    // The range checks still hold.
    assert!(refusal(bias(&[("1000", 1.0)], &text)).contains("outside the vocabulary"));
    assert!(refusal(bias(&[("1", 100.5)], &text)).contains("[-100, 100]"));
    assert!(refusal(bias(&[("1", f32::NAN)], &text)).contains("[-100, 100]"));
}

#[test]
fn logit_bias_has_at_most_max_entries() {
    let text = Text::words();
    let ids: Vec<String> = (0..=MAX_LOGIT_BIAS_ENTRIES)
        .map(|i| i.to_string())
        .collect();
    let full: Vec<(&str, f32)> = ids[..MAX_LOGIT_BIAS_ENTRIES]
        .iter()
        .map(|k| (k.as_str(), 1.0))
        .collect();
    assert_eq!(bias(&full, &text).unwrap().len(), MAX_LOGIT_BIAS_ENTRIES);
    let over: Vec<(&str, f32)> = ids.iter().map(|k| (k.as_str(), 1.0)).collect();
    let message = refusal(bias(&over, &text));
    assert!(
        message.contains(&format!("{} entries", MAX_LOGIT_BIAS_ENTRIES + 1))
            && message.contains(&MAX_LOGIT_BIAS_ENTRIES.to_string()),
        "{message}"
    );
}
