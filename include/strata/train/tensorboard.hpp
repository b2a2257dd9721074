#pragma once
/// \file strata/train/tensorboard.hpp
/// Keras's TensorBoard callback (scalars), written with strata/io/tensorboard.hpp's
/// EventFileWriter. Opt-in: strata/strata.hpp does not include it.
///
/// \code
///   model.fit(train, {.epochs = 10, .validation_data = test,
///                     .callbacks = {std::make_shared<strata::train::TensorBoard>("logs/run1")}});
///   // then: tensorboard --logdir logs
/// \endcode

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "strata/config.hpp"
#include "strata/io/tensorboard.hpp"
#include "strata/train/callbacks.hpp"

namespace strata::train {

/// Options of the TensorBoard callback.
struct TensorBoardOptions {
    /// 0: scalars once per epoch (Keras's update_freq="epoch"); N > 0: also the running batch
    /// figures every N batches, as batch_loss, batch_accuracy at the global step (Keras's
    /// update_freq=N).
    std::int64_t update_freq = 0;
};

/// Keras's TensorBoard callback, for scalars: after each epoch it writes every figure of the
/// epoch's logs, as Keras does. Training figures go to `log_dir`/train as epoch_<name>
/// (epoch_loss, epoch_accuracy, epoch_lr), validation figures to `log_dir`/validation with the
/// "val_" dropped (epoch_loss, epoch_accuracy), so TensorBoard draws train and validation of
/// one figure in one chart. The step is the epoch (from 0).
///
/// Requires: `log_dir` can be created and written (IoError naming it when training starts
/// otherwise); update_freq >= 0 (ValueError).
///   auto tb = std::make_shared<strata::train::TensorBoard>("logs/run1");
///   model.fit(train, {.epochs = 5, .validation_data = test, .callbacks = {tb}});
class TensorBoard : public Callback {
public:
    explicit TensorBoard(std::filesystem::path log_dir, TensorBoardOptions options = {});

    // STRATA_DECL here too: header-only, the virtual members are inline already in the class, so
    // it has no key function and a unit that only includes this header emits neither the vtable
    // nor the members' code (0.8 s instead of 1.6 s at -O2); compiled, libstrata holds them.
    STRATA_DECL void on_train_begin(TrainingContext& ctx) override;
    STRATA_DECL void on_train_batch_end(TrainingContext&, std::int64_t, const Logs& logs) override;
    STRATA_DECL void on_epoch_end(TrainingContext&, int epoch, const Logs& logs) override;
    STRATA_DECL void on_train_end(TrainingContext&, const Logs&) override;

    /// The event files of the last (or current) fit call: train, then validation if written.
    const std::vector<std::filesystem::path>& files() const noexcept { return files_; }

private:
    /// The figures of `logs` whose name starts with "val_" (`validation`) or does not, tagged
    /// `prefix` + name without "val_".
    static std::vector<io::tensorboard::Scalar> scalars_of(const Logs& logs, const char* prefix, bool validation);

    std::filesystem::path log_dir_;
    TensorBoardOptions options_;
    std::unique_ptr<io::tensorboard::EventFileWriter> train_, validation_;
    std::vector<std::filesystem::path> files_;
    std::int64_t step_ = 0;
};

}  // namespace strata::train

#if STRATA_DEFINITIONS
#include "strata/train/impl/tensorboard.ipp"
#endif
