//! The subject a descriptor is limited under: its domain and entries,
//! each length-prefixed so that no two descriptors share one, whatever
//! bytes their values hold. A leaf.

/// `rls:` then, for the domain and each key and value, its length in
/// bytes, `:`, and the text. Long subjects are hashed by the stores, so a
/// client's long value costs a bounded amount of state.
pub(crate) fn descriptor_subject(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut subject = String::with_capacity(
        8 + domain.len()
            + entries
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>(),
    );
    subject.push_str("rls:");
    push(&mut subject, domain);
    for (key, value) in entries {
        push(&mut subject, key);
        push(&mut subject, value);
    }
    subject
}

fn push(subject: &mut String, part: &str) {
    subject.push_str(&part.len().to_string());
    subject.push(':');
    subject.push_str(part);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_never_run_into_each_other() {
        let one = descriptor_subject("d", &[("k", "a4:b")]);
        let two = descriptor_subject("d", &[("k", "a"), ("b", "")]);
        assert_ne!(one, two);
        assert_eq!(descriptor_subject("d", &[("k", "v")]), "rls:1:d1:k1:v");
    }
}
