// What the MPI files of the transport layer share (mpi_transport.cc,
// mpi_world.cc, mpi_elastic.cc, mpi_p2p.cc, mpi_store_channel.cc...): error text, the
// checks of return codes and counts, communicators of some ranks, and the
// communicator gyre's world is made of. Internal to collectives/transport/:
// it includes mpi.h, which no header outside this directory does.
//
// Threads: world_comm() is read and replaced only under gyre's API lock
// (init, rebuild) and by the transports made from it, never concurrently.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gyre/collectives/transport.h"

namespace gyre::transport::detail {

// MPI counts are int: a message above this size is sent as several pieces
// with the same tag. Both sides cut a message of a given size the same way,
// and MPI keeps messages of one (source, tag) in order, so the pieces match.
inline constexpr std::size_t kDefaultPieceBytes = std::size_t{1} << 30;

// How often a wait calls its interrupt check (Transport::set_interrupt_check,
// and MpiWorld::make_transport's wait for the other ranks).
inline constexpr std::chrono::milliseconds kInterruptCheckPeriod{50};

// The Transport over `comm`, which it owns and frees (mpi_transport.cc).
// `yield_when_idle`: give the core away now and then while waiting;
// `max_piece_bytes`: the largest single MPI message; `same_host[r]`: whether
// the rank r of `comm` shares this rank's host (its messages then travel
// over shared memory, where small ones are cut into eager pieces); empty:
// treat every peer as on this host.
std::unique_ptr<Transport> make_mpi_transport(MPI_Comm comm, bool yield_when_idle,
                                              std::size_t max_piece_bytes,
                                              std::vector<char> same_host = {});

std::string mpi_error_string(int code);

// Throws TransportError naming `call` unless `code` is MPI_SUCCESS.
void check_mpi(int code, const char* call);

// Throws for a failed call with one peer, naming `who` (the part of gyre:
// "point-to-point", "parameter store"), the call and the peer:
// RankFailedError when the peer died (process_failure), else TransportError.
void check_peer_call(int code, MPI_Comm comm, const char* who, const char* call, int peer);

// `bytes` as an MPI count of MPI_BYTE; InvalidArgument, naming `who`, over
// INT_MAX.
int byte_count(std::size_t bytes, const char* who);

// A communicator of `ranks` (ranks of `parent`, in that order), collective
// over those ranks alone (MPI_Comm_create_group); `tag` keeps concurrent
// creations on one parent apart.
MPI_Comm comm_of_ranks(MPI_Comm parent, const std::vector<int>& ranks, int tag);

// MPI_COMM_WORLD until MpiWorld::rebuild() replaces it by the survivors'
// communicator, or MpiWorld::instance(ranks) by the listed ranks' (until
// instance() with no ranks); every communicator gyre makes is derived from it.
MPI_Comm& world_comm();

// True when `code` says that a peer process failed, or that `comm` was
// revoked because some rank saw one fail (ULFM error classes). It then
// revokes `comm` (idempotent), so that every rank's pending and later
// operations on it fail too, also on ranks that never talk to the dead one.
// Always false in a build without ULFM, or with fault tolerance off at run
// time (the failure then ends the job as before).
bool process_failure(int code, MPI_Comm comm);

// The ranks of `comm` this process knows to have failed (ULFM's failure
// detector; acknowledges them on `comm`), in increasing order. Local; also
// on a revoked communicator. Empty in a build without ULFM, or with fault
// tolerance off at run time.
std::vector<int> failed_ranks(MPI_Comm comm);

// After a rebuild (ULFM on): a duplicate of `comm` made by MPIX_Comm_shrink,
// whose agreement on the new communicator tolerates failures, instead of
// MPI_Comm_dup/idup; false (and `out` untouched) in a build without ULFM or
// with fault tolerance off at run time; RankFailedError when a member of
// `comm` has died (the result would be smaller). See MpiWorld::make_transport.
bool ft_duplicate(MPI_Comm comm, MPI_Comm* out);

// How many times a failure was noticed in this process
// (MpiWorld::retire_communicators, which process_failure calls): read when a
// communicator is made, handed to free_comm when it goes.
std::uint64_t failure_epoch();

// Frees `comm` (made when failure_epoch() was `made_at`) unless a failure
// was noticed since or its owner's traffic was `cut_short` (peers may still
// send on it): then it is kept, unused, until MPI ends
// (MpiWorld::retire_communicators says why). Sets `comm` to MPI_COMM_NULL.
void free_comm(MPI_Comm& comm, std::uint64_t made_at, bool cut_short = false);

}  // namespace gyre::transport::detail
