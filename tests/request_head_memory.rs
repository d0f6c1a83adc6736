//! What a connection counts for an open stream's decoded head
//! (`RequestHead::held_bytes`) is at least the memory the head holds,
//! whatever its list's shape: measured with an allocator that tallies this
//! thread's live allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use cairn::grpc::request::RequestHead;
use cairn_proto::h2::hpack::{Block, Field};

struct Tally;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

/// At least what the daemon's allocator (jemalloc) takes for a request of
/// `size`: rounded up to a multiple of 16 up to 128 bytes, and of a quarter
/// of the next power of two above (jemalloc's steps are 16, then a quarter
/// of the power of two below).
fn class(size: usize) -> isize {
    let step = if size <= 128 {
        16
    } else {
        (size.next_power_of_two() / 4).max(16)
    };
    size.div_ceil(step).max(1) as isize * step as isize
}

// SAFETY: every call is passed to `System` unchanged; the tally is a
// thread-local `Cell` with a const initialiser, which never allocates.
unsafe impl GlobalAlloc for Tally {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|l| l.set(l.get() + class(layout.size())));
        // SAFETY: the caller's layout is passed on as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|l| l.set(l.get() - class(layout.size())));
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static TALLY: Tally = Tally;

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// A `RequestHead` built from `block`, its map then grown to hold `fields`
/// fields in all (as names that collide in its hash grow it): the memory it
/// holds, and what it counts for.
fn held_and_counted(block: &Block, fields: usize) -> (usize, usize) {
    let before = live();
    let mut head = Box::new(RequestHead::of(block));
    let more = fields.saturating_sub(head.headers.len());
    head.headers.reserve(more);
    assert!(head.validate().is_ok(), "a well-formed gRPC head");
    let held = usize::try_from(live() - before).expect("building a head allocates");
    (held, head.held_bytes())
}

fn grpc_head(extra: Vec<(String, String)>) -> Block {
    let mut fields: Vec<(String, String)> = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/etcdserverpb.Watch/Watch"),
        (":authority", "127.0.0.1:2379"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v.to_owned()))
    .collect();
    fields.extend(extra);
    Block::literals(fields.iter().map(|(n, v)| (n.as_str(), v.as_str())))
}

#[test]
fn a_held_header_list_is_counted_at_least_at_the_memory_it_takes() {
    let etcd_client = grpc_head(vec![
        ("user-agent".into(), "grpc-go/1.58.3".into()),
        ("grpc-timeout".into(), "4999913u".into()),
        ("authorization".into(), "x".repeat(200)),
    ]);
    // Lists of many tiny fields, each where the map's tables are emptiest
    // for their size: distinct three-letter names, 1,546 fields in all, just
    // past the map's growth at 1,536; and one name repeated, 1,027 values
    // of it just past its extra values' growth at 1,024.
    let letter = |i: usize| char::from(b'a' + (i % 26) as u8);
    let distinct: Vec<(String, String)> = (0..1_540)
        .map(|i| {
            (
                format!("{}{}{}", letter(i / 676), letter(i / 26), letter(i)),
                "v".into(),
            )
        })
        .collect();
    let distinct = grpc_head(distinct);
    let repeated = grpc_head(vec![("a".into(), "v".into()); 1_027]);
    let large = grpc_head(vec![("x-pad".into(), "p".repeat(60_000))]);
    let medium: Vec<(String, String)> = (0..400)
        .map(|i| (format!("x-field-{i}"), "m".repeat(100)))
        .collect();
    let medium = grpc_head(medium);
    for (what, block, grown_for) in [
        ("an etcd client's", &etcd_client, 0),
        ("1,546 fields of distinct three-letter names", &distinct, 0),
        ("1,027 values of one name", &repeated, 0),
        ("one 60,000-byte field", &large, 0),
        ("400 fields of 100 bytes", &medium, 0),
        // 1,546 fields in a map grown to 16,384 slots, as about 1,640 names
        // chosen to collide in its unkeyed hash could make it.
        ("1,546 fields in a map grown for 12,000", &distinct, 12_000),
    ] {
        let (held, counted) = held_and_counted(block, grown_for);
        let list: usize = block.fields.iter().map(Field::list_bytes).sum();
        println!("{what}: list {list} bytes, held {held}, counted {counted}");
        assert!(
            held <= counted,
            "{what} header list ({list} bytes as HTTP/2 counts it) holds {held} bytes \
             but counts for {counted}"
        );
        assert!(
            counted <= 3 * held + 1024,
            "{what} header list counts for {counted} bytes, far above the {held} it holds"
        );
    }
}
