//! A shard's answer to one command, and answers gathered per asking core.
//!
//! A command comes from a request task on some core; its answer wakes that
//! task. Sent from the shard's core, each answer to another core is a remote
//! wake-up of that core's runtime: an eventfd write, and a halted vCPU woken
//! if the core sleeps (`strace -c` of one member under 100 clients: about
//! 0.6 eventfd writes per put, most of them answers). A shard answers many
//! commands in one step (the entries of one Ready applied, a batch of
//! commands taken from its inbox), so within such a step ([`step`])
//! the answers to each other core are gathered and handed to that core as
//! one job of its mailbox, which sends them there: one wake-up per core and
//! step instead of one per answer. Outside a step, or to the same core, an
//! answer is sent at once.

use std::cell::RefCell;

use tokio::sync::oneshot;

use crate::runtime::{self, CoreJob};
use crate::server::errors::ApiError;

/// The answer to one command, sent once.
#[derive(Debug)]
pub struct Reply<T> {
    tx: oneshot::Sender<Result<T, ApiError>>,
    /// The core the asker waits on; `None` off the cores (tests, the
    /// simulator, threads of the blocking pool).
    asker_core: Option<usize>,
}

/// What a [`Reply`] is received through.
pub type Answered<T> = oneshot::Receiver<Result<T, ApiError>>;

/// The asker stopped waiting before its answer was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskerGone;

impl<T: Send + 'static> Reply<T> {
    /// A reply for an asker on the calling thread's core, and where its
    /// answer arrives.
    pub fn channel() -> (Reply<T>, Answered<T>) {
        let (tx, rx) = oneshot::channel();
        let reply = Reply {
            tx,
            asker_core: runtime::this_core(),
        };
        (reply, rx)
    }

    /// Sends the answer: within a [`step`] on another core than the
    /// asker's, with the batch; else now. A gathered answer whose asker is
    /// gone by the time it arrives is dropped there.
    pub fn send(self, answer: Result<T, ApiError>) -> Result<(), AskerGone> {
        match self.asker_core.filter(|&c| Some(c) != runtime::this_core()) {
            Some(to) if in_step() => {
                let tx = self.tx;
                gather(
                    to,
                    Box::new(move || {
                        let _ = tx.send(answer);
                    }),
                );
                Ok(())
            }
            _ => self.tx.send(answer).map_err(|_| AskerGone),
        }
    }

    /// Whether the asker stopped waiting.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Most answers to one core gathered before they are handed on, mid-step:
/// a long step (a thousand commands taken at once, each range read there)
/// must not hold its first answers back until its end.
pub const ANSWERS_PER_JOB: usize = 64;

thread_local! {
    /// The answers of the step under way, per asking core: `None` outside a
    /// step.
    static GATHERED: RefCell<Option<Vec<Vec<CoreJob>>>> = const { RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// Jobs handed to other cores by this thread's steps.
    static HANDED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether the calling thread runs a [`step`].
fn in_step() -> bool {
    GATHERED.with(|g| g.borrow().is_some())
}

/// Adds `job` to the step's answers for core `to` (within a [`step`]),
/// handing them on once there are [`ANSWERS_PER_JOB`].
fn gather(to: usize, job: CoreJob) {
    let full = GATHERED.with(|g| {
        let mut g = g.borrow_mut();
        let per_core = g.as_mut().expect("answers are gathered within a step");
        if per_core.len() <= to {
            per_core.resize_with(to + 1, Vec::new);
        }
        per_core[to].push(job);
        (per_core[to].len() >= ANSWERS_PER_JOB).then(|| std::mem::take(&mut per_core[to]))
    });
    if let Some(answers) = full {
        hand_on(to, answers);
    }
}

/// Runs `answers` on core `to`, as one job of its mailbox; where that
/// cannot be (its mailbox is full, or it stopped), sends them from here.
fn hand_on(to: usize, answers: Vec<CoreJob>) {
    let job: CoreJob = Box::new(move || {
        for answer in answers {
            answer();
        }
    });
    match runtime::try_send_to_core(to, job) {
        Ok(()) => {
            #[cfg(test)]
            HANDED.with(|h| h.set(h.get() + 1));
        }
        Err(gone) => (gone.0)(),
    }
}

/// Runs `f` as one step of a shard driver: its answers to other cores go
/// out together when it returns (in jobs of at most [`ANSWERS_PER_JOB`]).
/// Steps nest: an inner one adds to the outer one's answers. A step is
/// synchronous (`f` cannot wait), so its answers wait only for its work.
pub fn step<R>(f: impl FnOnce() -> R) -> R {
    let outer = GATHERED.with(|g| {
        let mut g = g.borrow_mut();
        if g.is_some() {
            return false;
        }
        *g = Some(Vec::new());
        true
    });
    // Hands the answers on at the end, also when `f` unwinds.
    struct End(bool);
    impl Drop for End {
        fn drop(&mut self) {
            if !self.0 {
                return;
            }
            let Some(per_core) = GATHERED.with(|g| g.borrow_mut().take()) else {
                return;
            };
            for (core, answers) in per_core.into_iter().enumerate() {
                if !answers.is_empty() {
                    hand_on(core, answers);
                }
            }
        }
    }
    let _end = End(outer);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Cores;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn handed() -> u64 {
        HANDED.with(|h| h.get())
    }

    /// Runs `asker` on core 0 and `answer` on core 1 of a two-core
    /// process, handing the asker's replies to the answerer. Returns what
    /// the asker received, in order, and the jobs the answerer handed on.
    fn on_two_cores(
        asks: usize,
        answer: impl Fn(Vec<Reply<usize>>) + Send + Sync + Clone + 'static,
    ) -> (Vec<Result<usize, String>>, u64) {
        let (to_answerer, from_asker) = std::sync::mpsc::channel::<Vec<Reply<usize>>>();
        let from_asker = Arc::new(Mutex::new(Some(from_asker)));
        let results = Arc::new(Mutex::new(Vec::new()));
        let jobs = Arc::new(Mutex::new(0));
        let (seen, counted) = (results.clone(), jobs.clone());
        let cores = Cores::start(2, None, Duration::ZERO, move |ctx| {
            let to_answerer = to_answerer.clone();
            let from_asker = from_asker.clone();
            let (seen, counted) = (seen.clone(), counted.clone());
            let answer = answer.clone();
            async move {
                if ctx.id == 0 {
                    let (replies, answered): (Vec<_>, Vec<_>) =
                        (0..asks).map(|_| Reply::<usize>::channel()).unzip();
                    to_answerer.send(replies).unwrap();
                    for rx in answered {
                        let got = match rx.await {
                            Ok(Ok(v)) => Ok(v),
                            Ok(Err(e)) => Err(format!("{e:?}")),
                            Err(_) => Err("dropped".to_string()),
                        };
                        seen.lock().unwrap().push(got);
                    }
                } else {
                    let rx = from_asker.lock().unwrap().take().unwrap();
                    let replies = tokio::task::spawn_blocking(move || rx.recv().unwrap())
                        .await
                        .unwrap();
                    let before = handed();
                    answer(replies);
                    *counted.lock().unwrap() = handed() - before;
                }
            }
        })
        .unwrap();
        cores.join();
        let r = results.lock().unwrap().clone();
        let j = *jobs.lock().unwrap();
        (r, j)
    }

    #[test]
    fn answers_of_one_step_reach_another_core_as_one_job() {
        let (results, jobs) = on_two_cores(50, |replies| {
            step(|| {
                for (i, r) in replies.into_iter().enumerate() {
                    // An inner step adds to the outer one.
                    step(|| r.send(Ok(i)).unwrap());
                }
            })
        });
        assert_eq!(results, (0..50).map(Ok).collect::<Vec<_>>());
        assert_eq!(jobs, 1, "one job for the asker's core");
    }

    #[test]
    fn a_long_step_hands_its_answers_on_as_they_gather() {
        let (results, jobs) = on_two_cores(200, |replies| {
            step(|| {
                for (i, r) in replies.into_iter().enumerate() {
                    r.send(Ok(i)).unwrap();
                    // Every full job has gone before the step ends.
                    assert_eq!(handed() as usize, (i + 1) / ANSWERS_PER_JOB);
                }
            })
        });
        assert_eq!(results, (0..200).map(Ok).collect::<Vec<_>>());
        assert_eq!(jobs as usize, 200usize.div_ceil(ANSWERS_PER_JOB));
    }

    #[test]
    fn answers_outside_a_step_go_at_once() {
        let (results, jobs) = on_two_cores(10, |replies| {
            for (i, r) in replies.into_iter().enumerate() {
                r.send(if i % 2 == 0 {
                    Ok(i)
                } else {
                    Err(ApiError::Stopped)
                })
                .unwrap();
            }
        });
        assert_eq!(results.len(), 10);
        assert_eq!(results[0], Ok(0));
        assert!(results[1].is_err());
        assert_eq!(jobs, 0);
    }

    /// Runs two cores: core 0 makes a reply, hands its receiving end to
    /// `asker` and its sending end to core 1, and stops; core 1 answers it
    /// with `answer`.
    fn reply_from_core0<A, F, Fut>(asker: A, answer: F)
    where
        A: Fn(Answered<u32>) + Send + Sync + Clone + 'static,
        F: Fn(Reply<u32>) -> Fut + Send + Sync + Clone + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let (to_core1, from_core0) = std::sync::mpsc::channel::<Reply<u32>>();
        let from_core0 = Arc::new(Mutex::new(Some(from_core0)));
        let cores = Cores::start(2, None, Duration::ZERO, move |ctx| {
            let (to_core1, from_core0) = (to_core1.clone(), from_core0.clone());
            let (asker, answer) = (asker.clone(), answer.clone());
            async move {
                if ctx.id == 0 {
                    let (reply, rx) = Reply::<u32>::channel();
                    asker(rx);
                    to_core1.send(reply).unwrap();
                    return;
                }
                let rx = from_core0.lock().unwrap().take().unwrap();
                let reply = tokio::task::spawn_blocking(move || rx.recv().unwrap())
                    .await
                    .unwrap();
                answer(reply).await;
            }
        })
        .unwrap();
        cores.join();
    }

    #[test]
    fn an_asker_on_another_core_that_is_gone_is_told_outside_a_step() {
        let told = Arc::new(Mutex::new(None));
        let seen = told.clone();
        reply_from_core0(drop, move |reply| {
            let seen = seen.clone();
            async move {
                *seen.lock().unwrap() = Some(reply.send(Ok(1)));
            }
        });
        assert_eq!(*told.lock().unwrap(), Some(Err(AskerGone)));
    }

    #[test]
    fn an_answer_on_the_askers_own_core_goes_at_once_within_a_step() {
        let cores = Cores::start(1, None, Duration::ZERO, |_ctx| async {
            let (reply, mut rx) = Reply::<u32>::channel();
            step(|| {
                reply.send(Ok(7)).unwrap();
                assert_eq!(rx.try_recv().unwrap().unwrap(), 7, "sent within the step");
            });
            assert_eq!(handed(), 0);
        })
        .unwrap();
        cores.join();
    }

    #[test]
    fn an_answer_off_the_cores_goes_at_once_and_a_gone_asker_is_told() {
        let (reply, mut rx) = Reply::<u32>::channel();
        step(|| {
            reply.send(Ok(7)).unwrap();
            assert_eq!(rx.try_recv().unwrap().unwrap(), 7, "sent within the step");
        });
        let (reply, rx) = Reply::<u32>::channel();
        drop(rx);
        assert!(reply.is_closed());
        assert_eq!(reply.send(Ok(1)), Err(AskerGone));
    }

    #[test]
    fn answers_to_a_core_that_stopped_are_sent_from_the_step() {
        // Core 0 makes a reply, hands its receiving end out and stops; core
        // 1 answers within a step once core 0's mailbox is closed.
        let (to_test, answered) = std::sync::mpsc::channel::<Answered<u32>>();
        reply_from_core0(
            move |rx| to_test.send(rx).unwrap(),
            |reply| async move {
                // Core 0's mailbox closes when its thread ends.
                while runtime::try_send_to_core(0, Box::new(|| {})).is_ok() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                step(|| reply.send(Ok(3)).unwrap());
                assert_eq!(handed(), 0, "nothing handed to a stopped core");
            },
        );
        let mut rx = answered.recv().unwrap();
        assert_eq!(rx.try_recv().unwrap().unwrap(), 3);
    }
}
