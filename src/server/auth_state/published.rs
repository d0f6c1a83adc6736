//! A value that every request reads and that changes rarely (the auth state,
//! the simple-token table), read without taking a lock or touching a shared
//! cache line.
//!
//! The writer replaces the value under a mutex and then bumps a version
//! number. Each thread keeps the last value it read with the version it read
//! it at; a read loads the version (one atomic load of a line that only
//! changes on a write) and, while it is unchanged, uses the thread's own copy.
//! Only the first read on a thread after a change takes the mutex, once.
//!
//! Ordering: the writer stores the new value before it bumps the version
//! (both under the mutex), and a reader loads the version before it reads
//! the value. A read that starts after a write returned sees the bumped
//! version and so the new value; a thread never caches an older value under
//! a newer version.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Distinguishes published values in a thread's cache.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A thread's copy of one published value.
struct Seen {
    id: u64,
    version: u64,
    value: Arc<dyn Any + Send + Sync>,
}

thread_local! {
    static SEEN: RefCell<Vec<Seen>> = const { RefCell::new(Vec::new()) };
}

/// See the module docs.
pub struct Published<T> {
    id: u64,
    version: AtomicU64,
    current: Mutex<Arc<T>>,
}

/// The writer's hold on a [`Published`] value: other writers wait, readers
/// do not.
pub struct Writer<'a, T> {
    version: &'a AtomicU64,
    current: MutexGuard<'a, Arc<T>>,
}

impl<T: Send + Sync + 'static> Published<T> {
    pub fn new(value: T) -> Published<T> {
        Published {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            version: AtomicU64::new(0),
            current: Mutex::new(Arc::new(value)),
        }
    }

    /// Calls `f` with the current value. Lock-free while the value is
    /// unchanged since this thread last read it.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let version = self.version.load(Ordering::Acquire);
        SEEN.with(|seen| {
            // A shared borrow: `f` may read other published values (nested
            // shared borrows are fine); a refresh below only borrows
            // mutably when no read is in progress on this thread.
            if let Ok(cache) = seen.try_borrow() {
                let hit = cache
                    .iter()
                    .find(|s| s.id == self.id && s.version == version)
                    .and_then(|s| s.value.downcast_ref::<T>());
                if let Some(value) = hit {
                    return f(value);
                }
            }
            let value = Arc::clone(&self.lock_current());
            if let Ok(mut cache) = seen.try_borrow_mut() {
                // Copies only this thread still holds belong to values
                // replaced since, or dropped: forget them.
                cache.retain(|s| s.id != self.id && Arc::strong_count(&s.value) > 1);
                cache.push(Seen {
                    id: self.id,
                    version,
                    value: value.clone(),
                });
            }
            f(&value)
        })
    }

    /// Takes the writer's lock: to read, change and replace the value as one
    /// step.
    pub fn write(&self) -> Writer<'_, T> {
        Writer {
            version: &self.version,
            current: self.lock_current(),
        }
    }

    fn lock_current(&self) -> MutexGuard<'_, Arc<T>> {
        // A writer that panicked left the old or the new value whole: the
        // value is replaced in one assignment.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T> Writer<'_, T> {
    pub fn get(&self) -> &T {
        &self.current
    }

    /// Replaces the value; readers see it from their next read on.
    pub fn set(&mut self, value: T) {
        *self.current = Arc::new(value);
        self.version.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn a_read_after_a_write_sees_it_on_every_thread() {
        let p = Arc::new(Published::new(0u64));
        assert_eq!(p.read(|v| *v), 0);
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    // Each thread reads (and caches) every value in turn;
                    // the values it sees never go back.
                    let mut last = 0;
                    while last < 1_000 {
                        let v = p.read(|v| *v);
                        assert!(v >= last, "read {v} after {last}");
                        last = v;
                    }
                })
            })
            .collect();
        for i in 1..=1_000u64 {
            p.write().set(i);
            assert_eq!(p.read(|v| *v), i, "the writer's thread reads its write");
        }
        for r in readers {
            r.join().unwrap();
        }
    }

    #[test]
    fn a_cached_read_does_not_wait_for_a_writer_holding_the_lock() {
        let p = Arc::new(Published::new(String::from("a")));
        // The first read on this thread takes the lock to copy the value:
        // before the writer can hold it (a writer that got there first
        // would wait for this thread at the barrier, forever).
        assert_eq!(p.read(|v| v.clone()), "a");
        let held = Arc::new(Barrier::new(2));
        let done = Arc::new(Barrier::new(2));
        let writer = {
            let (p, held, done) = (p.clone(), held.clone(), done.clone());
            std::thread::spawn(move || {
                let mut w = p.write();
                held.wait();
                // The reader finishes while this thread holds the lock.
                done.wait();
                w.set("b".into());
            })
        };
        held.wait();
        assert_eq!(p.read(|v| v.clone()), "a", "read from this thread's copy");
        done.wait();
        writer.join().unwrap();
        assert_eq!(p.read(|v| v.clone()), "b");
    }

    #[test]
    fn reads_nest_and_values_of_one_type_stay_apart() {
        let a = Published::new(1u32);
        let b = Published::new(2u32);
        assert_eq!(a.read(|x| b.read(|y| x + y)), 3);
        // A write seen for the first time inside a nested read is read from
        // the lock, and cached by a later read.
        b.write().set(5);
        assert_eq!(a.read(|x| b.read(|y| x + y)), 6);
        assert_eq!(b.read(|y| *y), 5);
        a.write().set(10);
        assert_eq!((a.read(|x| *x), b.read(|y| *y)), (10, 5));
    }

    #[test]
    fn copies_of_dropped_values_are_forgotten() {
        for i in 0..100u64 {
            let p = Published::new(vec![i; 1_000]);
            assert_eq!(p.read(|v| v[0]), i);
        }
        let p = Published::new(0u8);
        p.read(|_| ());
        let cached = SEEN.with(|s| s.borrow().len());
        assert!(
            cached <= 2,
            "{cached} copies cached after the others were dropped"
        );
    }
}
