fn main() {
    eprintln!("cairn: the daemon is not built yet");
    std::process::exit(2);
}
