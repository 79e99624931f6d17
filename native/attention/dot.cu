// The attention passes of kind kDot (TransformerConv): forward, target-side and source-side
// backward, instantiated for this kind alone so that each kind compiles in
// its own translation unit.
#include "host.cuh"

namespace gnnio {
namespace attention {

template struct KindOps<kDot>;
template struct FromEdgesOps<kDot>;

}  // namespace attention
}  // namespace gnnio
