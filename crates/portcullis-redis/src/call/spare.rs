//! Command buffers kept per thread for the next call: a call's `Cmd` (its
//! argument bytes and argument list) is cleared and reused rather than
//! allocated twice per check. At most [`SPARES`] per thread, each from a
//! command of at most [`MAX_BYTES`] bytes, so what is kept stays small; a
//! call whose future is dropped mid-flight simply drops its command.
//! (The `redis` crate offers `Cmd::clear` for exactly this reuse; it keeps
//! no pool of its own.)

use std::cell::RefCell;

use redis::Cmd;

/// Commands kept per thread.
const SPARES: usize = 4;

/// The largest command (in estimated bytes) whose buffers are kept.
pub(crate) const MAX_BYTES: usize = 1024;

thread_local! {
    static SPARE: RefCell<Vec<Cmd>> = const { RefCell::new(Vec::new()) };
}

/// An empty command: a spare one of this thread's, or a new one sized for
/// `count` arguments of `bytes` bytes.
pub(crate) fn take(count: usize, bytes: usize) -> Cmd {
    SPARE
        .with(|spare| spare.borrow_mut().pop())
        .unwrap_or_else(|| Cmd::with_capacity(count, bytes))
}

/// Gives `cmd` back for this thread's next call, when it was built for at
/// most [`MAX_BYTES`] (`bytes`, its estimate) and fewer than [`SPARES`]
/// are kept.
pub(crate) fn give_back(mut cmd: Cmd, bytes: usize) {
    if bytes > MAX_BYTES {
        return;
    }
    cmd.clear();
    SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        if spare.len() < SPARES {
            spare.push(cmd);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_given_back_comes_back_empty_and_the_spares_are_bounded() {
        let mut cmd = take(4, 64);
        cmd.arg("FCALL").arg("f").arg(1).arg("key");
        give_back(cmd, 64);
        let again = take(4, 64);
        assert_eq!(again.args_iter().count(), 0, "cleared");
        for _ in 0..2 * SPARES {
            give_back(Cmd::new(), 64);
        }
        let kept = SPARE.with(|spare| spare.borrow().len());
        assert_eq!(kept, SPARES);
        give_back(Cmd::new(), MAX_BYTES + 1);
        assert_eq!(SPARE.with(|spare| spare.borrow().len()), SPARES);
    }
}
