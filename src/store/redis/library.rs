//! delayq's Redis function library: the Lua source (`src/store/lua/`), put
//! together once, and the three functions it registers, one per kind of call.
//!
//! A function library, unlike a script, is compiled and set up once when it
//! is loaded; a call then runs only its own work. Its name carries a hash of
//! its source, so processes of different delayq versions sharing one Redis
//! each call their own.

use redis::Script;

const PRELUDE: &str = include_str!("../lua/prelude.lua");
const DISPATCH: &str = include_str!("../lua/batch.lua");

/// The operations of each kind, with their Lua source.
macro_rules! ops {
    ($($name:ident),+ $(,)?) => {
        &[$((stringify!($name), include_str!(concat!("../lua/", stringify!($name), ".lua")))),+]
    };
}

/// What a call may do when Redis is over `maxmemory`, which decides which
/// function an operation runs in. Puts are refused whole, up front, so a put
/// never leaves a job half written; moves of existing jobs (they free memory
/// or barely change it) and reads still run, so workers can drain a full
/// Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Puts,
    Moves,
    Reads,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Puts, Kind::Moves, Kind::Reads];

    fn suffix(self) -> &'static str {
        match self {
            Kind::Puts => "puts",
            Kind::Moves => "moves",
            Kind::Reads => "reads",
        }
    }

    fn flags(self) -> &'static str {
        match self {
            Kind::Puts => "",
            Kind::Moves => "'allow-oom'",
            Kind::Reads => "'no-writes'",
        }
    }

    fn ops(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kind::Puts => ops!(put),
            Kind::Moves => ops!(
                reserve,
                reserve_job,
                give_back,
                delete,
                release,
                bury,
                touch,
                kick,
                kick_job,
                pause_tube,
                release_all,
                tick,
                tube_ref,
            ),
            Kind::Reads => ops!(peek, stats_job, stats_tube, stats, list_tubes),
        }
    }
}

/// The library's source and the names of its functions.
pub(super) struct Library {
    /// What `FUNCTION LOAD` takes.
    pub source: String,
    functions: [String; 3],
}

impl Library {
    pub fn new() -> Library {
        let mut body = format!("{PRELUDE}\n");
        for kind in Kind::ALL {
            for (_, source) in kind.ops() {
                body.push_str(source);
                body.push('\n');
            }
        }
        body.push_str(DISPATCH);
        let hash = Script::new(&body).get_hash().to_owned();
        let name = format!("delayq_{}", &hash[..16]);
        let functions = Kind::ALL.map(|kind| format!("{name}_{}", kind.suffix()));
        let mut source = format!("#!lua name={name}\n{body}\n");
        for kind in Kind::ALL {
            let allowed: Vec<String> = kind
                .ops()
                .iter()
                .map(|(op, _)| format!("{op}=true"))
                .collect();
            source.push_str(&format!(
                "redis.register_function{{function_name='{}', callback=dispatcher({{{}}}), flags={{{}}}}}\n",
                functions[kind as usize],
                allowed.join(", "),
                kind.flags(),
            ));
        }
        Library { source, functions }
    }

    /// The function that runs operations of `kind`.
    pub fn function(&self, kind: Kind) -> &str {
        &self.functions[kind as usize]
    }
}

/// For benchmarks: delayq's function library (what `FUNCTION LOAD` takes),
/// and one whole command, starting with `FCALL`, that runs `n` operations
/// `op` ("put" or "reserve") in one call, on the tube `bench` under the
/// default prefix: 100-byte ready jobs for `put`. `None` for another `op`.
pub fn bench_call(op: &str, n: usize) -> Option<(String, Vec<Vec<u8>>)> {
    let (kind, args): (Kind, Vec<&[u8]>) = match op {
        "put" => (
            Kind::Puts,
            vec![b"bench", b"", b"0", b"0", b"60000", &[b'x'; 100]],
        ),
        "reserve" => (Kind::Moves, vec![b"bench:1", b"bench"]),
        _ => return None,
    };
    let library = Library::new();
    let tag = "{delayq:}";
    let mut command: Vec<Vec<u8>> = vec![
        b"FCALL".to_vec(),
        library.function(kind).into(),
        b"1".to_vec(),
        format!("{tag}jobs").into(),
        tag.into(),
    ];
    for _ in 0..n {
        command.push(op.into());
        command.push(args.len().to_string().into());
        command.extend(args.iter().map(|a| a.to_vec()));
    }
    Some((library.source, command))
}
