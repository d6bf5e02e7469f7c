//! `mount.fuse.rmemfs SOURCE DIR [-o OPTIONS]`: the helper mount(8) runs for
//! `mount -t fuse.rmemfs` and fstab lines of that type (cargo names it
//! `mount_rmemfs`; scripts/install puts it where mount(8) looks). The work is in
//! [`fsd::mount_helper`].

use fsd::mount_helper::{run, Invocation, HELPER_NAME};

fn main() {
    // The token comes from token_file= or not at all: fsd's parser, which the
    // helper runs to check the options, would otherwise take it from here too.
    std::env::remove_var("RMEMFS_TOKEN");
    let result = Invocation::parse(std::env::args_os().skip(1)).and_then(|inv| run(&inv));
    if let Err(e) = result {
        eprintln!("{HELPER_NAME}: {e}");
        std::process::exit(e.exit_code());
    }
}
