#pragma once
/// \file strata/train/impl/tensorboard.ipp
/// The definitions behind strata/train/tensorboard.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <string>
#include <string_view>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/train/tensorboard.hpp"

namespace strata::train {

STRATA_DECL TensorBoard::TensorBoard(std::filesystem::path log_dir, TensorBoardOptions options)
    : log_dir_(std::move(log_dir)), options_(options) {
    STRATA_CHECK(options_.update_freq >= 0, ValueError, "TensorBoard: update_freq must be >= 0 (0: per epoch only), got ",
                 options_.update_freq);
}

STRATA_DECL void TensorBoard::on_train_begin(TrainingContext& ctx) {
    // Fresh files per fit call, as Keras's writers are per run; the validation writer only
    // once there is something to write, so a run without validation has no empty folder.
    // Only the chief writes: elsewhere train_ stays null and nothing is written.
    validation_.reset();
    train_.reset();
    files_.clear();
    step_ = 0;
    if (!ctx.is_chief()) return;
    train_ = std::make_unique<io::tensorboard::EventFileWriter>(log_dir_ / "train");
    files_ = {train_->path()};
}

STRATA_DECL void TensorBoard::on_train_batch_end(TrainingContext&, std::int64_t, const Logs& logs) {
    ++step_;
    if (options_.update_freq > 0 && step_ % options_.update_freq == 0 && train_)
        train_->add_scalars(scalars_of(logs, "batch_", false), step_);
}

STRATA_DECL void TensorBoard::on_epoch_end(TrainingContext&, int epoch, const Logs& logs) {
    if (!train_) return;
    const double now = io::tensorboard::wall_time_now();
    train_->add_scalars(scalars_of(logs, "epoch_", false), epoch, now);
    const auto val = scalars_of(logs, "epoch_", true);
    if (!val.empty()) {
        if (!validation_) {
            validation_ = std::make_unique<io::tensorboard::EventFileWriter>(log_dir_ / "validation");
            files_.push_back(validation_->path());
        }
        validation_->add_scalars(val, epoch, now);
    }
}

STRATA_DECL void TensorBoard::on_train_end(TrainingContext&, const Logs&) {
    // Closed at the end of fit: the files are complete and another run may start.
    train_.reset();
    validation_.reset();
}

STRATA_DECL std::vector<io::tensorboard::Scalar> TensorBoard::scalars_of(const Logs& logs, const char* prefix, bool validation) {
    std::vector<io::tensorboard::Scalar> out;
    for (int i = 0; i < logs.size(); ++i) {
        const std::string_view name = logs.name(i);
        const bool is_val = name.substr(0, 4) == "val_";
        if (is_val != validation) continue;
        out.push_back({prefix + std::string(is_val ? name.substr(4) : name), logs.value(i)});
    }
    return out;
}

}  // namespace strata::train
