//! `delayq drain`: waiting for a tube's workers to get through its jobs.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use tokio::time::Instant;

use super::client::{Client, Fault};
use super::{Outcome, out, yaml};

/// How often the tube's stats are read. The protocol has no way to be told
/// when a tube empties, so a client waiting on a remote server polls; five
/// `stats-tube` a second cost the server next to nothing and are fine for a
/// person watching.
const POLL: Duration = Duration::from_millis(200);

/// A wait for a tube to empty.
#[derive(Debug, Clone)]
pub(super) struct Drain {
    /// The tube.
    pub tube: String,
    /// When to give up; `None` waits for as long as it takes.
    pub timeout: Option<Duration>,
    /// Whether buried jobs must be gone too. They are left out by default:
    /// they stay until a person kicks or deletes them, so a drain that
    /// counted them would wait for that person.
    pub include_buried: bool,
}

/// A tube's jobs by state, as `stats-tube` counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    ready: u64,
    delayed: u64,
    reserved: u64,
    buried: u64,
}

impl Drain {
    /// Polls until the tube has no jobs left that count (exit 0), or the
    /// timeout passes (exit 1), with a progress bar on a terminal.
    pub(super) async fn run(&self, client: &mut Client) -> Result<Outcome, Fault> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let bar = self.bar();
        let mut shown = false;
        // The most jobs seen at once: the bar's length, raised when jobs
        // arrive faster than they are worked.
        let mut most = 0;
        loop {
            let counts = self.counts(client).await?;
            let left = self.left(counts);
            if left == 0 {
                bar.finish_and_clear();
                out(format!("drained {}\n", self.tube).as_bytes());
                return Ok(Outcome::Done);
            }
            most = most.max(left);
            // One update, so no frame shows a new length with an old
            // position.
            bar.update(|state| {
                state.set_len(most);
                state.set_pos(most - left);
            });
            if !shown && std::io::stderr().is_terminal() {
                // Only now that it has something to show: drawn before, it
                // would flash an empty bar.
                bar.set_draw_target(ProgressDrawTarget::stderr());
                shown = true;
            }
            let now = Instant::now();
            let nap = match deadline {
                Some(deadline) if now >= deadline => {
                    // The message below says what the bar said, on a line
                    // of its own.
                    bar.finish_and_clear();
                    let Counts {
                        ready,
                        delayed,
                        reserved,
                        buried,
                    } = counts;
                    eprintln!(
                        "delayq: timed out: {left} jobs left in {} \
                         (ready {ready}, delayed {delayed}, reserved {reserved}, buried {buried})",
                        self.tube
                    );
                    return Ok(Outcome::Nothing);
                }
                // The last look comes at the deadline, not a poll after it.
                Some(deadline) => POLL.min(deadline - now),
                None => POLL,
            };
            tokio::time::sleep(nap).await;
        }
    }

    /// The jobs that still count.
    fn left(&self, c: Counts) -> u64 {
        let buried = if self.include_buried { c.buried } else { 0 };
        c.ready + c.delayed + c.reserved + buried
    }

    /// The tube's counts; all zero if it does not exist, since a tube that
    /// holds jobs always does.
    async fn counts(&self, client: &mut Client) -> Result<Counts, Fault> {
        let line = format!("stats-tube {}", self.tube);
        let Some(doc) = client.yaml(&line).await? else {
            return Ok(Counts::default());
        };
        let get = |key: &str| {
            yaml::number(&doc, key)
                .ok_or_else(|| Fault::Server(format!("stats-tube without a number for {key}")))
        };
        Ok(Counts {
            ready: get("current-jobs-ready")?,
            delayed: get("current-jobs-delayed")?,
            reserved: get("current-jobs-reserved")?,
            buried: get("current-jobs-buried")?,
        })
    }

    /// The bar, hidden until [`Drain::run`] has counts for it, and for
    /// good when standard error is a file or a pipe, where redraws would
    /// only be noise.
    fn bar(&self) -> ProgressBar {
        let bar = ProgressBar::hidden();
        // The template is a constant, checked by the tests of this module.
        if let Ok(style) = ProgressStyle::with_template(BAR_TEMPLATE) {
            bar.set_style(style.progress_chars("=> ").with_key("left", jobs_left));
        }
        bar.set_prefix(format!("draining {}", self.tube));
        bar
    }
}

/// How the bar looks: the tube, the jobs worked of the most seen, how many
/// are left, how long it has been.
const BAR_TEMPLATE: &str = "{prefix} [{bar:30}] {left} left, {pos} done ({elapsed})";

/// The bar's `{left}`: the jobs still to go, the bar's length less its
/// position.
fn jobs_left(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let left = state.len().unwrap_or(0).saturating_sub(state.pos());
    // The bar writes into a String, which cannot fail.
    let _ = write!(w, "{left}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_template_is_valid() {
        assert!(ProgressStyle::with_template(BAR_TEMPLATE).is_ok());
        let mut state = String::new();
        let bar = ProgressBar::hidden();
        bar.update(|s| {
            s.set_len(5);
            s.set_pos(2);
        });
        bar.update(|s| jobs_left(s, &mut state));
        assert_eq!(state, "3");
    }

    #[test]
    fn buried_jobs_count_only_when_asked() {
        let counts = Counts {
            ready: 1,
            delayed: 2,
            reserved: 3,
            buried: 4,
        };
        let mut drain = Drain {
            tube: "t".into(),
            timeout: None,
            include_buried: false,
        };
        assert_eq!(drain.left(counts), 6);
        drain.include_buried = true;
        assert_eq!(drain.left(counts), 10);
    }
}
